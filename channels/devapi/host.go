package devapi

import (
	"encoding/binary"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/goep-dev/goep/internal/device"
)

// The device API on host-backend memory. Each function mirrors the one of
// the same name in the .cuh files (goep_sem_wait -> SemWait, ...). Pointers
// are host-backend device pointers (real addresses of mmap'd pages).

// U64 is the 64-bit word at p, for atomic access.
func U64(p uintptr) *atomic.Uint64 { return &device.HostSlice[atomic.Uint64](p, 1)[0] }

// U32 is the 32-bit word at p, for atomic access.
func U32(p uintptr) *atomic.Uint32 { return &device.HostSlice[atomic.Uint32](p, 1)[0] }

// Bytes views n bytes at p.
func Bytes(p uintptr, n uint64) []byte { return device.HostSlice[byte](p, int(n)) }

// SpinCheckEvery mirrors GOEP_SPIN_CHECK_EVERY.
const SpinCheckEvery = 64

// Spin is goep_spin: the state of one bounded wait. Each failed poll yields
// the processor, so goroutine ranks on few cores make progress.
type Spin struct {
	start time.Time
	count uint32
}

// Aborted is goep_aborted.
func Aborted(wd uintptr) bool { return U32(wd+WatchdogAbort).Load() != AbortNone }

// Expire is goep_watchdog_expire: the first caller claims the record (by
// moving abort from 0), fills it and publishes state last.
func Expire(wd uintptr, op, id, peer, stage uint32, waited time.Duration, expected, observed uint64) {
	if !U32(wd+WatchdogAbort).CompareAndSwap(AbortNone, AbortTimeout) {
		return
	}
	rec := uintptr(U64(wd + WatchdogRecord).Load())
	U32(rec + RecordOp).Store(op)
	U32(rec + RecordID).Store(id)
	U32(rec + RecordPeer).Store(peer)
	U32(rec + RecordStage).Store(stage)
	U64(rec + RecordWaitedNS).Store(uint64(waited))
	U64(rec + RecordExpected).Store(expected)
	U64(rec + RecordObserved).Store(observed)
	U32(rec + RecordState).Store(TimeoutExpired)
}

// OK is goep_spin_ok: true to keep spinning, false to give up.
func (s *Spin) OK(wd uintptr, op, id, peer, stage uint32, expected, observed uint64) bool {
	if s == nil {
		return false // no spin state: stop waiting rather than panic in a twin
	}
	runtime.Gosched()
	s.count++
	if s.count&(SpinCheckEvery-1) != 0 {
		return true
	}
	if Aborted(wd) {
		return false
	}
	now := time.Now()
	if s.start.IsZero() {
		s.start = now
		return true
	}
	waited := now.Sub(s.start)
	if uint64(waited) < U64(wd+WatchdogTimeoutNS).Load() {
		return true
	}
	Expire(wd, op, id, peer, stage, waited, expected, observed)
	return false
}

// WaitGE64 is goep_wait_ge_u64.
func WaitGE64(p uintptr, target uint64, wd uintptr, id, peer, stage uint32) bool {
	var s Spin
	for {
		v := U64(p).Load()
		if v >= target {
			return true
		}
		if !s.OK(wd, OpValue, id, peer, stage, target, v) {
			return false
		}
	}
}

// SemSignal is goep_sem_signal (and goep_sem_relaxed_signal: Go atomics
// have one ordering).
func SemSignal(s Semaphore) { U64(s.Remote).Add(1) }

// SemPoll is goep_sem_poll.
func SemPoll(s Semaphore) bool {
	want := U64(s.Expected).Load() + 1
	if U64(s.Inbound).Load() >= want {
		U64(s.Expected).Store(want)
		return true
	}
	return false
}

// SemWait is goep_sem_wait; op tells relaxed waits apart in the record.
func SemWait(s Semaphore, op, stage uint32) bool {
	want := U64(s.Expected).Load() + 1
	var sp Spin
	for {
		got := U64(s.Inbound).Load()
		if got >= want {
			U64(s.Expected).Store(want)
			return true
		}
		if !sp.OK(s.Watchdog, op, s.ID, s.Peer, stage, want, got) {
			return false
		}
	}
}

// Copy is goep_copy.
func Copy(dst, src uintptr, n uint64) {
	if n == 0 {
		return
	}
	copy(Bytes(dst, n), Bytes(src, n))
}

// ---------------------------------------------------------------------------
// LL packets. Each 8-byte {data, flag} half is one atomic 64-bit word, which
// is exactly the atomicity the GPU protocol relies on.

// FlagNext is goep_ll_flag_next.
func FlagNext(f uint32) uint32 {
	f++
	if f == 0 {
		return 2
	}
	return f
}

// FlagBegin is goep_ll_flag_begin.
func FlagBegin(flag uintptr) uint32 { return FlagNext(U32(flag + LLFlagValue).Load()) }

// FlagEnd is goep_ll_flag_end for a launch whose blocks all ran in this
// call (host twins run the whole grid).
func FlagEnd(flag uintptr, f uint32) {
	U32(flag + LLFlagArrived).Store(0)
	U32(flag + LLFlagValue).Store(f)
}

func halfWord(data, flag uint32) uint64 { return uint64(data) | uint64(flag)<<32 }

// LL16Store is goep_ll16_store.
func LL16Store(p uintptr, d1, d2, flag uint32) {
	U64(p + LL16Data1).Store(halfWord(d1, flag))
	U64(p + LL16Data2).Store(halfWord(d2, flag))
}

// LL16Try is goep_ll16_try.
func LL16Try(p uintptr, flag uint32) (d1, d2, seen uint32, ok bool) {
	a, b := U64(p+LL16Data1).Load(), U64(p+LL16Data2).Load()
	f1, f2 := uint32(a>>32), uint32(b>>32)
	seen = f2
	if f1 != flag {
		seen = f1
	}
	return uint32(a), uint32(b), seen, f1 == flag && f2 == flag
}

// LL8Store is goep_ll8_store.
func LL8Store(p uintptr, d, flag uint32) { U64(p).Store(halfWord(d, flag)) }

// LL8Try is goep_ll8_try.
func LL8Try(p uintptr, flag uint32) (d, seen uint32, ok bool) {
	v := U64(p).Load()
	return uint32(v), uint32(v >> 32), uint32(v>>32) == flag
}

// Waiter names a wait for the timeout record.
type Waiter struct {
	Watchdog        uintptr
	ID, Peer, Stage uint32
}

// LL16Read is goep_ll16_read.
func LL16Read(p uintptr, flag uint32, w Waiter) (uint64, bool) {
	var s Spin
	for {
		d1, d2, seen, ok := LL16Try(p, flag)
		if ok {
			return uint64(d1) | uint64(d2)<<32, true
		}
		if !s.OK(w.Watchdog, OpPacket, w.ID, w.Peer, w.Stage, uint64(flag), uint64(seen)) {
			return 0, false
		}
	}
}

// LL8Read is goep_ll8_read.
func LL8Read(p uintptr, flag uint32, w Waiter) (uint32, bool) {
	var s Spin
	for {
		d, seen, ok := LL8Try(p, flag)
		if ok {
			return d, true
		}
		if !s.OK(w.Watchdog, OpPacket, w.ID, w.Peer, w.Stage, uint64(flag), uint64(seen)) {
			return 0, false
		}
	}
}

// gather reads payload word k (w bytes) of src, zero-padded past n.
func gather(src []byte, k, w uint64) uint64 {
	if at := k * w; at+w <= uint64(len(src)) {
		if w == 8 {
			return binary.LittleEndian.Uint64(src[at:])
		}
		return uint64(binary.LittleEndian.Uint32(src[at:]))
	}
	var v uint64
	for b := uint64(0); b < w && k*w+b < uint64(len(src)); b++ {
		v |= uint64(src[k*w+b]) << (8 * b)
	}
	return v
}

// scatter writes payload word k of dst, stopping at its end.
func scatter(dst []byte, k, w, v uint64) {
	if at := k * w; at+w <= uint64(len(dst)) {
		if w == 8 {
			binary.LittleEndian.PutUint64(dst[at:], v)
		} else {
			binary.LittleEndian.PutUint32(dst[at:], uint32(v))
		}
		return
	}
	for b := uint64(0); b < w && k*w+b < uint64(len(dst)); b++ {
		dst[k*w+b] = byte(v >> (8 * b))
	}
}

// words views n 64-bit words at p for atomic access (one view per range
// keeps per-packet overhead low).
func words(p uintptr, n uint64) []atomic.Uint64 { return device.HostSlice[atomic.Uint64](p, int(n)) }

// LL16Put is goep_ll16_put.
func LL16Put(dst, src uintptr, n uint64, flag uint32) {
	s, count := Bytes(src, n), (n+7)/8
	pk := words(dst, 2*count)
	for k := uint64(0); k < count; k++ {
		v := gather(s, k, 8)
		pk[2*k].Store(halfWord(uint32(v), flag))
		pk[2*k+1].Store(halfWord(uint32(v>>32), flag))
	}
}

// LL8Put is goep_ll8_put.
func LL8Put(dst, src uintptr, n uint64, flag uint32) {
	s, count := Bytes(src, n), (n+3)/4
	pk := words(dst, count)
	for k := uint64(0); k < count; k++ {
		pk[k].Store(halfWord(uint32(gather(s, k, 4)), flag))
	}
}

// LL16Unpack is goep_ll16_unpack.
func LL16Unpack(dst, src uintptr, n uint64, flag uint32, w Waiter) bool {
	d, count := Bytes(dst, n), (n+7)/8
	pk := words(src, 2*count)
	for k := uint64(0); k < count; k++ {
		a, b := pk[2*k].Load(), pk[2*k+1].Load()
		if uint32(a>>32) != flag || uint32(b>>32) != flag {
			v, ok := LL16Read(src+uintptr(k*LL16Size), flag, w)
			if !ok {
				return false
			}
			a, b = v&0xffffffff, v>>32
		}
		scatter(d, k, 8, uint64(uint32(a))|uint64(uint32(b))<<32)
	}
	return true
}

// LL8Unpack is goep_ll8_unpack.
func LL8Unpack(dst, src uintptr, n uint64, flag uint32, w Waiter) bool {
	d, count := Bytes(dst, n), (n+3)/4
	pk := words(src, count)
	for k := uint64(0); k < count; k++ {
		v := pk[k].Load()
		if uint32(v>>32) != flag {
			d32, ok := LL8Read(src+uintptr(k*LL8Size), flag, w)
			if !ok {
				return false
			}
			v = uint64(d32)
		}
		scatter(d, k, 4, uint64(uint32(v)))
	}
	return true
}

// ChannelWaiter names waits on channel c at stage.
func ChannelWaiter(c MemoryChannel, stage uint32) Waiter {
	return Waiter{Watchdog: c.Sem.Watchdog, ID: c.Sem.ID, Peer: c.Sem.Peer, Stage: stage}
}
