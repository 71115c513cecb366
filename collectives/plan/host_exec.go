package plan

import (
	"fmt"
)

// runBlock runs one threadblock's instructions in order.
func (l *hostLaunch) runBlock(rank int, b *Block) error {
	for i := range b.Instrs {
		in := &b.Instrs[i]
		if err := l.exec(rank, b, in); err != nil {
			return l.opError(rank, b, in, err)
		}
	}
	return nil
}

func (l *hostLaunch) opError(rank int, b *Block, in *Instr, err error) error {
	if err == errAborted {
		return err
	}
	where := fmt.Sprintf("op %d (%s)", in.OpIndex, in.Code)
	if in.BodyIndex >= 0 {
		where = fmt.Sprintf("op %d (pipeline) body op %d (%s)", in.OpIndex, in.BodyIndex, in.Code)
	}
	return fmt.Errorf("plan %q: rank %d: threadblock %d: %s: %w", l.w.plan.Name, rank, b.ID, where, err)
}

// exec runs one instruction.
func (l *hostLaunch) exec(rank int, b *Block, in *Instr) error {
	if l.ctx.Err() != nil {
		return errAborted
	}
	switch in.Code {
	case OpNop:
		return nil // ops of a host block are already in order
	case OpBarrier:
		return l.barrier(rank, in.BarrierID, int(in.BarrierBlocks))
	case OpSignal, OpRelaxedSignal:
		return l.signal(rank, b, in)
	case OpWait, OpRelaxedWait:
		return l.waitSignals(rank, b, in)
	case OpFlush:
		for _, c := range in.ChannelList() {
			if err := l.proxies[rank].flush(int(b.PortChannels[c])); err != nil {
				return err
			}
		}
		return nil
	case OpPut, OpPutWithSignal, OpPutWithSignalAndFlush:
		if in.Channel == ChanPort {
			return l.portPut(rank, b, in)
		}
		return l.memoryPut(rank, b, in)
	case OpGet, OpCopy:
		for i := range in.NDst {
			data, err := l.read(rank, b, &in.Src[i])
			if err != nil {
				return err
			}
			if err := l.write(rank, b, &in.Dst[i], data); err != nil {
				return err
			}
		}
		return nil
	case OpReduce, OpReduceSend, OpReadReduce, OpReadReduceSend:
		return l.reduce(rank, b, in)
	case OpPutPackets:
		return l.putPackets(rank, b, in)
	case OpReadPutPackets:
		return l.readPutPackets(rank, b, in)
	case OpCopyPackets:
		data, err := l.read(rank, b, &in.Src[0])
		if err != nil {
			return err
		}
		return l.writePackets(rank, b, &in.Dst[0], data)
	case OpUnpackPackets:
		data, err := l.readPackets(rank, b, &in.Src[0])
		if err != nil {
			return err
		}
		return l.write(rank, b, &in.Dst[0], data)
	case OpReducePackets, OpReduceSendPackets, OpReduceCopyPackets, OpReduceCopySendPackets:
		return l.reducePackets(rank, b, in)
	case OpSemAcquire:
		for _, s := range in.Sems[:in.NSems] {
			sem := &l.sems[rank][s]
			err := l.wait(func() bool {
				v := sem.Load()
				return v > 0 && sem.CompareAndSwap(v, v-1)
			}, func() string { return fmt.Sprintf("semaphore %d (value %d)", s, sem.Load()) })
			if err != nil {
				return err
			}
		}
		return nil
	case OpSemRelease:
		for _, s := range in.Sems[:in.NSems] {
			l.sems[rank][s].Add(1)
		}
		return nil
	case OpPipeline:
		return l.pipeline(rank, b, in)
	}
	return fmt.Errorf("%s is not supported by the host interpreter", in.Code)
}

// pipeline runs the body Iterations times; non-packet ops see the
// iteration's slice of their ranges, packet ops their whole range (as
// upstream).
func (l *hostLaunch) pipeline(rank int, b *Block, in *Instr) error {
	wrap := l.w.res[rank].ScratchWrap
	for it := uint64(0); it < in.Iterations; it++ {
		off := it * in.UnitBytes
		for j := range in.Body {
			sub := in.Body[j]
			if !sub.Code.Packet() && (sub.NSrc > 0 || sub.NDst > 0) {
				if off >= sub.Size() {
					continue
				}
				sub = sub.Slice(off, in.UnitBytes, wrap)
			}
			if err := l.exec(rank, b, &sub); err != nil {
				return l.opError(rank, b, &sub, fmt.Errorf("iteration %d: %w", it, err))
			}
		}
	}
	return nil
}

// channel resolves the i-th channel of an instruction: rank-level index
// and the peer's end.
func (l *hostLaunch) channel(rank int, b *Block, in *Instr, i int) (idx, peer, pair int) {
	t := 0
	list := b.MemoryChannels
	chans := l.w.res[rank].MemoryChannels
	if in.Channel == ChanPort {
		t, list, chans = 1, b.PortChannels, l.w.res[rank].PortChannels
	}
	idx = list[in.Channels[i]]
	return idx, chans[idx].Peer, l.w.pairs[rank][t][idx]
}

func (l *hostLaunch) signal(rank int, b *Block, in *Instr) error {
	for i := range int(in.NChannels) {
		idx, peer, pair := l.channel(rank, b, in, i)
		if in.Channel == ChanPort {
			if err := l.proxies[rank].push(trigger{ch: idx, signal: true}); err != nil {
				return err
			}
			continue
		}
		if pair >= 0 { // an unpaired channel's signals land nowhere, as upstream
			l.chans[peer][0][pair].inbound.Add(1)
		}
	}
	return nil
}

func (l *hostLaunch) waitSignals(rank int, b *Block, in *Instr) error {
	t := 0
	if in.Channel == ChanPort {
		t = 1
	}
	for i := range int(in.NChannels) {
		idx, peer, _ := l.channel(rank, b, in, i)
		cs := &l.chans[rank][t][idx]
		want := cs.expected.Add(1)
		err := l.wait(func() bool { return cs.inbound.Load() >= want }, func() string {
			return fmt.Sprintf("signal %d on %s channel %d from rank %d (has %d)", want, in.Channel, idx, peer, cs.inbound.Load())
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// read returns an operand's bytes, zeros past Valid.
func (l *hostLaunch) read(rank int, b *Block, o *Operand) ([]byte, error) {
	_, buf := l.locate(rank, b, o)
	if err := span(buf, o.Offset, o.Valid, o); err != nil {
		return nil, err
	}
	out := make([]byte, o.Size)
	if o.Valid > 0 {
		copy(out, buf[o.Offset:o.Offset+o.Valid])
	}
	return out, nil
}

// write stores data into an operand, dropping bytes past Valid.
func (l *hostLaunch) write(rank int, b *Block, o *Operand, data []byte) error {
	_, buf := l.locate(rank, b, o)
	n := min(o.Valid, uint64(len(data)))
	if err := span(buf, o.Offset, n, o); err != nil {
		return err
	}
	if n > 0 {
		copy(buf[o.Offset:o.Offset+n], data[:n])
	}
	return nil
}

func (l *hostLaunch) memoryPut(rank int, b *Block, in *Instr) error {
	for i := range in.NDst {
		src := &in.Src[0]
		if in.NSrc > 1 {
			src = &in.Src[i]
		}
		data, err := l.read(rank, b, src)
		if err != nil {
			return err
		}
		if err := l.write(rank, b, &in.Dst[i], data); err != nil {
			return err
		}
	}
	return nil
}

// reduce: dst0 = src0 op src1 op ...; sends also write dst1.. (remote).
func (l *hostLaunch) reduce(rank int, b *Block, in *Instr) error {
	acc, err := l.read(rank, b, &in.Src[0])
	if err != nil {
		return err
	}
	for i := 1; i < int(in.NSrc); i++ {
		x, err := l.read(rank, b, &in.Src[i])
		if err != nil {
			return err
		}
		ReduceInto(l.dt, in.Reduce, acc, x)
	}
	for i := range in.NDst {
		if err := l.write(rank, b, &in.Dst[i], acc); err != nil {
			return err
		}
	}
	return nil
}

// reducePackets: dst0 = src0 op packets(src1..); recpkt/recspkt also write
// the result as packets to dst1; the send forms write packets to the rest.
func (l *hostLaunch) reducePackets(rank int, b *Block, in *Instr) error {
	acc, err := l.read(rank, b, &in.Src[0])
	if err != nil {
		return err
	}
	for i := 1; i < int(in.NSrc); i++ {
		x, err := l.readPackets(rank, b, &in.Src[i])
		if err != nil {
			return err
		}
		ReduceInto(l.dt, in.Reduce, acc, x)
	}
	if err := l.write(rank, b, &in.Dst[0], acc); err != nil {
		return err
	}
	for i := 1; i < int(in.NDst); i++ {
		if err := l.writePackets(rank, b, &in.Dst[i], acc); err != nil {
			return err
		}
	}
	return nil
}

// putPackets: memory form packs local data into the peers' scratch; port
// form has the proxy copy packets already in local scratch.
func (l *hostLaunch) putPackets(rank int, b *Block, in *Instr) error {
	for i := range int(in.NDst) {
		src := &in.Src[0]
		if in.NSrc > 1 {
			src = &in.Src[i]
		}
		if in.Channel == ChanPort {
			idx, _, _ := l.channel(rank, b, in, i)
			if err := l.proxies[rank].push(trigger{ch: idx, put: true, raw: true, block: b, src: *src, dst: in.Dst[i]}); err != nil {
				return err
			}
			continue
		}
		data, err := l.read(rank, b, src)
		if err != nil {
			return err
		}
		if err := l.writePackets(rank, b, &in.Dst[i], data); err != nil {
			return err
		}
	}
	return nil
}

// readPutPackets waits for packets in local scratch, then forwards them:
// memory form writes them (same flag) into the peers' scratch; port form has
// the proxy copy them.
func (l *hostLaunch) readPutPackets(rank int, b *Block, in *Instr) error {
	data, err := l.readPackets(rank, b, &in.Src[0])
	if err != nil {
		return err
	}
	for i := range int(in.NDst) {
		if in.Channel == ChanPort {
			idx, _, _ := l.channel(rank, b, in, i)
			if err := l.proxies[rank].push(trigger{ch: idx, put: true, raw: true, block: b, src: in.Src[0], dst: in.Dst[i]}); err != nil {
				return err
			}
			continue
		}
		if err := l.writePackets(rank, b, &in.Dst[i], data); err != nil {
			return err
		}
	}
	return nil
}

// portPut pushes put triggers (thread i: destination i on channel i).
func (l *hostLaunch) portPut(rank int, b *Block, in *Instr) error {
	for i := range int(in.NDst) {
		src := in.Src[0]
		if in.NSrc > 1 {
			src = in.Src[i]
		}
		idx, _, _ := l.channel(rank, b, in, i)
		t := trigger{ch: idx, put: true, block: b, src: src, dst: in.Dst[i]}
		t.signal = in.Code != OpPut
		if err := l.proxies[rank].push(t); err != nil {
			return err
		}
		if in.Code == OpPutWithSignalAndFlush {
			if err := l.proxies[rank].flush(idx); err != nil {
				return err
			}
		}
	}
	return nil
}
