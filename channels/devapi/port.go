package devapi

import "fmt"

// Port channels: goep_fifo, goep_port_channel and the trigger encoding of
// kernels/channel_abi.cuh, and the Go version of fifo_device.cuh and
// port_device.cuh that the host backend's kernel twins use.

// Trigger types (GOEP_TRIGGER_*): put, signal and flush combine; a word op
// (bit 3 set: an atomic add or a store of a 64-bit value) travels alone.
const (
	TriggerPut       = 1
	TriggerSignal    = 2
	TriggerFlush     = 4
	TriggerAtomicAdd = 8
	TriggerStore     = 9
)

// IsWordOp reports whether t carries a value for a 64-bit word (an atomic
// add or a store) rather than a put, signal or flush.
func (t Trigger) IsWordOp() bool { return t.Type&TriggerAtomicAdd != 0 }

// Trigger field limits.
const (
	TriggerCommit      = uint64(1) << 63
	TriggerMaxSize     = 1<<31 - 1
	TriggerMaxChannels = 1024
	TriggerMaxMemories = 256
	// PortMaxChunk is the largest put one trigger carries; the device API
	// splits larger puts (GOEP_PORT_MAX_CHUNK).
	PortMaxChunk = 1 << 30
)

// Trigger is one decoded FIFO entry.
type Trigger struct {
	Type           uint32
	Channel        uint32
	Dst, Src       uint32 // memory ids
	DstOff, SrcOff uint64
	Size           uint64
	Value          uint64 // word ops
}

// Words encodes t without commit bits (the pusher adds them).
func (t Trigger) Words() (w0, w1 uint64) {
	w1 = t.DstOff&0xffffffff | uint64(t.Type&0xf)<<32 | uint64(t.Channel&0x3ff)<<36 | uint64(t.Dst&0xff)<<46
	if t.IsWordOp() {
		w0 = t.Value & (TriggerCommit - 1)
		w1 |= (t.Value >> 63) << 54
		return w0, w1
	}
	w0 = t.SrcOff&0xffffffff | (t.Size&TriggerMaxSize)<<32
	w1 |= uint64(t.Src&0xff) << 54
	return w0, w1
}

// DecodeTrigger reads a trigger's words (commit bits ignored).
func DecodeTrigger(w0, w1 uint64) Trigger {
	t := Trigger{
		Type:    uint32(w1>>32) & 0xf,
		Channel: uint32(w1>>36) & 0x3ff,
		Dst:     uint32(w1>>46) & 0xff,
		DstOff:  w1 & 0xffffffff,
	}
	if t.IsWordOp() {
		t.Value = w0&(TriggerCommit-1) | (w1>>54&1)<<63
		return t
	}
	t.Src = uint32(w1>>54) & 0xff
	t.SrcOff = w0 & 0xffffffff
	t.Size = w0 >> 32 & TriggerMaxSize
	return t
}

// Commit is the commit bit of position pos in a ring of size slots: set on
// even laps, clear on odd ones.
func Commit(pos uint64, size uint32) uint64 {
	if (pos/uint64(size))&1 == 0 {
		return TriggerCommit
	}
	return 0
}

func (t Trigger) String() string {
	switch t.Type {
	case TriggerAtomicAdd:
		return fmt.Sprintf("atomicAdd(channel %d, memory %d + %d, %d)", t.Channel, t.Dst, t.DstOff, t.Value)
	case TriggerStore:
		return fmt.Sprintf("store(channel %d, memory %d + %d, %#x)", t.Channel, t.Dst, t.DstOff, t.Value)
	}
	return fmt.Sprintf("trigger %#x (channel %d, %d bytes, memory %d + %d -> memory %d + %d)",
		t.Type, t.Channel, t.Size, t.Src, t.SrcOff, t.Dst, t.DstOff)
}

// Fifo is goep_fifo.
type Fifo struct {
	Triggers, Head, Tail, TailCache, Done, Watchdog uintptr
	Size                                            uint32
}

// Encode writes f into b[:FifoSize] (reserved bytes zero).
func (f Fifo) Encode(b []byte) {
	clear(b[:FifoSize])
	le.PutUint64(b[FifoTriggers:], uint64(f.Triggers))
	le.PutUint64(b[FifoHead:], uint64(f.Head))
	le.PutUint64(b[FifoTail:], uint64(f.Tail))
	le.PutUint64(b[FifoTailCache:], uint64(f.TailCache))
	le.PutUint64(b[FifoDone:], uint64(f.Done))
	le.PutUint64(b[FifoWatchdog:], uint64(f.Watchdog))
	le.PutUint32(b[FifoSlots:], f.Size)
}

// DecodeFifo reads a goep_fifo from b.
func DecodeFifo(b []byte) Fifo {
	_ = b[FifoSize-1]
	return Fifo{
		Triggers:  uintptr(le.Uint64(b[FifoTriggers:])),
		Head:      uintptr(le.Uint64(b[FifoHead:])),
		Tail:      uintptr(le.Uint64(b[FifoTail:])),
		TailCache: uintptr(le.Uint64(b[FifoTailCache:])),
		Done:      uintptr(le.Uint64(b[FifoDone:])),
		Watchdog:  uintptr(le.Uint64(b[FifoWatchdog:])),
		Size:      le.Uint32(b[FifoSlots:]),
	}
}

// PortChannel is goep_port_channel.
type PortChannel struct {
	Fifo              Fifo
	Sem               Semaphore
	Channel, Dst, Src uint32
}

// Encode writes c into b[:PortChannelSize] (reserved bytes zero).
func (c PortChannel) Encode(b []byte) {
	clear(b[:PortChannelSize])
	c.Fifo.Encode(b[PCFifo:])
	c.Sem.Encode(b[PCSem:])
	le.PutUint32(b[PCChannel:], c.Channel)
	le.PutUint32(b[PCDst:], c.Dst)
	le.PutUint32(b[PCSrc:], c.Src)
}

// Bytes is c encoded.
func (c PortChannel) Bytes() []byte {
	b := make([]byte, PortChannelSize)
	c.Encode(b)
	return b
}

// DecodePortChannel reads a goep_port_channel from b.
func DecodePortChannel(b []byte) PortChannel {
	_ = b[PortChannelSize-1]
	return PortChannel{
		Fifo:    DecodeFifo(b[PCFifo:]),
		Sem:     DecodeSemaphore(b[PCSem:]),
		Channel: le.Uint32(b[PCChannel:]),
		Dst:     le.Uint32(b[PCDst:]),
		Src:     le.Uint32(b[PCSrc:]),
	}
}

// ---------------------------------------------------------------------------
// The device API on the host backend.

// FifoPush is goep_fifo_push: claims a position, waits (bounded) for room,
// stores both words with the position's commit bit. ok is false when the
// wait for room gave up.
func FifoPush(f Fifo, t Trigger, id, peer, stage uint32) (pos uint64, ok bool) {
	w0, w1 := t.Words()
	pos = U64(f.Head).Add(1) - 1
	size := uint64(f.Size)
	if pos >= U64(f.TailCache).Load()+size {
		var sp Spin
		var tail uint64
		for {
			if tail = U64(f.Tail).Load(); pos < tail+size {
				break
			}
			if !sp.OK(f.Watchdog, OpFifoPush, id, peer, stage, pos-size+1, tail) {
				return pos, false
			}
		}
		for c := U64(f.TailCache); ; {
			old := c.Load()
			if old >= tail || c.CompareAndSwap(old, tail) {
				break
			}
		}
	}
	commit := Commit(pos, f.Size)
	slot := f.Triggers + uintptr(pos&(size-1))*TriggerSize
	U64(slot).Store(w0 | commit)
	U64(slot + 8).Store(w1 | commit)
	return pos, true
}

// FifoSync is goep_fifo_sync: waits until the proxy has completed the flush
// at pos.
func FifoSync(f Fifo, pos uint64, id, peer, stage uint32) bool {
	var sp Spin
	for {
		done := U64(f.Done).Load()
		if done > pos {
			return true
		}
		if !sp.OK(f.Watchdog, OpFlush, id, peer, stage, pos+1, done) {
			return false
		}
	}
}

func portPush(c PortChannel, t Trigger, stage uint32) (uint64, bool) {
	t.Channel = c.Channel
	return FifoPush(c.Fifo, t, c.Sem.ID, c.Sem.Peer, stage)
}

// PortPutIDs is goep_pc_put_ids with flags TriggerSignal / TriggerFlush
// (the combined forms): puts n bytes from memory src at srcOff to memory
// dst at dstOff, in chunks of at most PortMaxChunk, the flags on the last.
func PortPutIDs(c PortChannel, dst uint32, dstOff uint64, src uint32, srcOff, n uint64, flags, stage uint32) bool {
	for {
		chunk := min(n, PortMaxChunk)
		t := Trigger{Type: TriggerPut, Dst: dst, Src: src, DstOff: dstOff, SrcOff: srcOff, Size: chunk}
		last := chunk == n
		if last {
			t.Type |= flags
		}
		pos, ok := portPush(c, t, stage)
		if !ok {
			return false
		}
		if last {
			if flags&TriggerFlush != 0 {
				return FifoSync(c.Fifo, pos, c.Sem.ID, c.Sem.Peer, stage)
			}
			return true
		}
		dstOff, srcOff, n = dstOff+chunk, srcOff+chunk, n-chunk
	}
}

// PortPut is goep_pc_put (flags 0), goep_pc_put_with_signal (TriggerSignal)
// and goep_pc_put_with_signal_and_flush (TriggerSignal|TriggerFlush) on the
// channel's default memories.
func PortPut(c PortChannel, dstOff, srcOff, n uint64, flags, stage uint32) bool {
	return PortPutIDs(c, c.Dst, dstOff, c.Src, srcOff, n, flags, stage)
}

// PortSignal is goep_pc_signal.
func PortSignal(c PortChannel, stage uint32) bool {
	_, ok := portPush(c, Trigger{Type: TriggerSignal}, stage)
	return ok
}

// PortFlush is goep_pc_flush.
func PortFlush(c PortChannel, stage uint32) bool {
	pos, ok := portPush(c, Trigger{Type: TriggerFlush}, stage)
	return ok && FifoSync(c.Fifo, pos, c.Sem.ID, c.Sem.Peer, stage)
}

// PortAtomicAdd is goep_pc_atomic_add_id.
func PortAtomicAdd(c PortChannel, dst uint32, off, value uint64, stage uint32) bool {
	_, ok := portPush(c, Trigger{Type: TriggerAtomicAdd, Dst: dst, DstOff: off, Value: value}, stage)
	return ok
}

// PortStore is goep_pc_store.
func PortStore(c PortChannel, off, value uint64, stage uint32) bool {
	_, ok := portPush(c, Trigger{Type: TriggerStore, Dst: c.Dst, DstOff: off, Value: value}, stage)
	return ok
}

// PortWait is goep_pc_wait.
func PortWait(c PortChannel, stage uint32) bool { return SemWait(c.Sem, OpSemWait, stage) }

// PortPoll is goep_pc_poll.
func PortPoll(c PortChannel) bool { return SemPoll(c.Sem) }
