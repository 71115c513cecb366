package channels

import (
	"bytes"
	"time"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// The channel modules this package registers (kernel names in devapi), and
// the host twins of kernels/channel_kernels.cu, written in devapi, the Go
// mirror of the channel device API. A twin runs the whole grid in one goroutine:
// block b's work follows block a's for a < b, which is one of the orders the
// GPU may pick; every kernel here is correct under any order of its blocks.

func blocks(g device.Dim3) int { return max(g.X, 1) * max(g.Y, 1) * max(g.Z, 1) }

func channelAt(base uintptr, i uint32) devapi.MemoryChannel {
	p := base + uintptr(i)*devapi.MemoryChannelSize
	return devapi.DecodeMemoryChannel(device.HostSlice[byte](p, devapi.MemoryChannelSize))
}

func semAt(base uintptr, stride, i uint32) devapi.Semaphore {
	p := base + uintptr(i)*uintptr(stride)
	return devapi.DecodeSemaphore(device.HostSlice[byte](p, devapi.SemaphoreSize))
}

func init() {
	kernels.Register(kernels.Module{Name: "channels", File: "channel_kernels.cu", Kernels: []string{
		devapi.KernelChanPut, devapi.KernelChanGet, devapi.KernelChanSemSignal, devapi.KernelChanSemWait,
		devapi.KernelChanPingPong, devapi.KernelChanLLExchange, devapi.KernelChanLLPattern, devapi.KernelChanPutAll,
		devapi.KernelChanCompare, devapi.KernelChanWaitValue,
	}})
	kernels.Register(kernels.Module{Name: "port", File: "port_kernels.cu", Kernels: []string{
		devapi.KernelPortStream, devapi.KernelPortAtomicStorm, devapi.KernelPortFlushAll, devapi.KernelPortPingPong,
		devapi.KernelPortPutBench, devapi.KernelPortAtomicRate, devapi.KernelPortSignalBurst,
	}})
	kernels.Register(kernels.Module{Name: "proxy", File: "proxy_kernels.cu", Kernels: []string{devapi.KernelProxyAtomicAdd}})
	// sem_lab.cu has no twin: it measures GPU latencies (TestSemaphoreLatencyLab).
	kernels.Register(kernels.Module{Name: "semlab", File: "sem_lab.cu", Kernels: []string{devapi.KernelSemLabPingPong}})
	// ce_lab.cu has no twin either: it loads the SMs beside a port put (TestCopyEngineLab).
	kernels.Register(kernels.Module{Name: "celab", File: "ce_lab.cu", Kernels: []string{devapi.KernelCELabLoad}})

	// goep_chan_put(chans, u32 idx, u64 dst_off, u64 src_off, u64 bytes, u32 signal)
	device.RegisterHostKernel(devapi.KernelChanPut, func(l *device.HostLaunch) error {
		a := l.Args
		ch := channelAt(a.GetPtr(0), a.GetU32(1))
		devapi.Copy(ch.Remote+uintptr(a.GetU64(2)), ch.Local+uintptr(a.GetU64(3)), a.GetU64(4))
		if a.GetU32(5) != 0 {
			for range blocks(l.Grid) {
				devapi.SemSignal(ch.Sem)
			}
		}
		return nil
	})
	// goep_chan_get(chans, u32 idx, u64 remote_off, u64 local_off, u64 bytes)
	device.RegisterHostKernel(devapi.KernelChanGet, func(l *device.HostLaunch) error {
		a := l.Args
		ch := channelAt(a.GetPtr(0), a.GetU32(1))
		devapi.Copy(ch.Local+uintptr(a.GetU64(3)), ch.Remote+uintptr(a.GetU64(2)), a.GetU64(4))
		return nil
	})
	// goep_chan_sem_signal(handles, u32 stride, u32 first, u32 count, u32 relaxed)
	device.RegisterHostKernel(devapi.KernelChanSemSignal, func(l *device.HostLaunch) error {
		a := l.Args
		for b := range blocks(l.Grid) {
			s := semAt(a.GetPtr(0), a.GetU32(1), a.GetU32(2)+uint32(b))
			for range a.GetU32(3) {
				devapi.SemSignal(s)
			}
		}
		return nil
	})
	// goep_chan_sem_wait(handles, u32 stride, u32 first, u32 count, u32 mode, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelChanSemWait, semWaitTwin)
	// goep_chan_pingpong(chans, u32 idx, u64 iters, u32 initiator, u32 with_data, u32 relaxed, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelChanPingPong, pingpongTwin)
	// goep_chan_ll_exchange(chans, u32 send_idx, u32 recv_idx, u32 proto, u64 src_off, u64 dst_off, u64 bytes,
	//                       u64 pkt_half, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelChanLLExchange, llExchangeTwin)
	// goep_chan_ll_pattern(chans, u32 send_idx, u32 recv_idx, u32 proto, u32 me, u64 words, u64 pkt_off,
	//                      u64 pkt_half, u32 seed, u32 iters, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelChanLLPattern, llPatternTwin)
	// goep_chan_put_all(chans, u32 nchans, u64 bytes, u64 src_stride, u64 dst_off)
	device.RegisterHostKernel(devapi.KernelChanPutAll, func(l *device.HostLaunch) error {
		a := l.Args
		n, stride, dstOff := a.GetU64(2), a.GetU64(3), a.GetU64(4)
		for p := range a.GetU32(1) {
			ch := channelAt(a.GetPtr(0), p)
			if ch.Remote != 0 {
				devapi.Copy(ch.Remote+uintptr(dstOff), ch.Local+uintptr(uint64(p)*stride), n)
			}
		}
		return nil
	})
	// goep_chan_compare(const u8* got, const u8* want, u64 n, u32 guard, u64 before, u64 after, u64* out)
	device.RegisterHostKernel(devapi.KernelChanCompare, compareTwin)
	// goep_chan_wait_value(const u64* p, u64 target, goep_watchdog* wd, u32 id, u32 peer, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelChanWaitValue, func(l *device.HostLaunch) error {
		a := l.Args
		ok := devapi.WaitGE64(a.GetPtr(0), a.GetU64(1), a.GetPtr(2), a.GetU32(3), a.GetU32(4), a.GetU32(5))
		devapi.U64(a.GetPtr(6)).Store(b2u(ok))
		return nil
	})
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func semWaitTwin(l *device.HostLaunch) error {
	a := l.Args
	count, mode, stage, out := a.GetU32(3), a.GetU32(4), a.GetU32(5), a.GetPtr(6)
	for b := range blocks(l.Grid) {
		s := semAt(a.GetPtr(0), a.GetU32(1), a.GetU32(2)+uint32(b))
		var done, empty uint64
		for range count {
			var ok bool
			switch mode {
			case 0:
				ok = devapi.SemWait(s, devapi.OpSemWait, stage)
			case 1:
				ok = devapi.SemWait(s, devapi.OpSemRelaxedWait, stage)
			default:
				var sp devapi.Spin
				ok = true
				for !devapi.SemPoll(s) {
					empty++
					if !sp.OK(s.Watchdog, devapi.OpSemPoll, s.ID, s.Peer, stage,
						devapi.U64(s.Expected).Load()+1, devapi.U64(s.Inbound).Load()) {
						ok = false
						break
					}
				}
			}
			if !ok {
				break
			}
			done++
		}
		o := out + uintptr(32*b)
		devapi.U64(o).Store(done)
		devapi.U64(o + 8).Store(devapi.U64(s.Inbound).Load())
		devapi.U64(o + 16).Store(devapi.U64(s.Expected).Load())
		devapi.U64(o + 24).Store(empty)
	}
	return nil
}

func pingpongTwin(l *device.HostLaunch) error {
	a := l.Args
	ch := channelAt(a.GetPtr(0), a.GetU32(1))
	iters, initiator, withData, stage, out := a.GetU64(2), a.GetU32(3) != 0, a.GetU32(4) != 0, a.GetU32(6), a.GetPtr(7)
	mine, theirs := devapi.U64(ch.Local), devapi.U64(ch.Remote)
	var done, bad uint64
	start := time.Now()
	for i := uint64(1); i <= iters; i++ {
		if initiator {
			if withData {
				theirs.Store(i)
			}
			devapi.SemSignal(ch.Sem)
			if !devapi.SemWait(ch.Sem, devapi.OpSemWait, stage) {
				break
			}
			if withData && mine.Load() != i {
				bad++
			}
		} else {
			if !devapi.SemWait(ch.Sem, devapi.OpSemWait, stage) {
				break
			}
			if withData {
				if mine.Load() != i {
					bad++
				}
				theirs.Store(i)
			}
			devapi.SemSignal(ch.Sem)
		}
		done++
	}
	devapi.U64(out).Store(done)
	devapi.U64(out + 8).Store(bad)
	devapi.U64(out + 16).Store(uint64(time.Since(start)))
	return nil
}

func llExchangeTwin(l *device.HostLaunch) error {
	a := l.Args
	snd, rcv := channelAt(a.GetPtr(0), a.GetU32(1)), channelAt(a.GetPtr(0), a.GetU32(2))
	proto, srcOff, dstOff, n, half, stage, out := a.GetU32(3), a.GetU64(4), a.GetU64(5), a.GetU64(6), a.GetU64(7), a.GetU32(8), a.GetPtr(9)
	flag := devapi.FlagBegin(rcv.Flag)
	pktOff := uintptr(uint64(flag&1) * half)
	w := devapi.ChannelWaiter(rcv, stage)
	var ok bool
	if proto == 16 {
		devapi.LL16Put(snd.RemotePackets+pktOff, snd.Local+uintptr(srcOff), n, flag)
		ok = devapi.LL16Unpack(rcv.Local+uintptr(dstOff), rcv.LocalPackets+pktOff, n, flag, w)
	} else {
		devapi.LL8Put(snd.RemotePackets+pktOff, snd.Local+uintptr(srcOff), n, flag)
		ok = devapi.LL8Unpack(rcv.Local+uintptr(dstOff), rcv.LocalPackets+pktOff, n, flag, w)
	}
	if !ok {
		devapi.U64(out).Add(1)
	}
	devapi.FlagEnd(rcv.Flag, flag)
	return nil
}

// llSeed is goep_chan_ll_seed.
func llSeed(seed, sender, flag uint32) uint32 {
	return seed ^ (sender * 0x9e3779b9) ^ (flag * 0x85ebca6b)
}

func llPatternTwin(l *device.HostLaunch) error {
	a := l.Args
	snd, rcv := channelAt(a.GetPtr(0), a.GetU32(1)), channelAt(a.GetPtr(0), a.GetU32(2))
	proto, me, words, pktOff, half := a.GetU32(3), a.GetU32(4), a.GetU64(5), a.GetU64(6), a.GetU64(7)
	seed, iters, stage, out := a.GetU32(8), a.GetU32(9), a.GetU32(10), a.GetPtr(11)
	from := rcv.Sem.Peer
	w := devapi.ChannelWaiter(rcv, stage)
	flag := devapi.FlagBegin(rcv.Flag)
	last := flag
	var bad, rounds uint64
	ok := true
	start := time.Now()
	for r := uint32(0); r < iters && ok; r++ {
		base := uintptr(pktOff + uint64(flag&1)*half)
		mine, theirs := llSeed(seed, me, flag), llSeed(seed, from, flag)
		if proto == 16 {
			for k := uint64(0); k < words; k++ {
				devapi.LL16Store(snd.RemotePackets+base+uintptr(k*devapi.LL16Size),
					kernels.PatternValue(2*k, mine), kernels.PatternValue(2*k+1, mine), flag)
			}
			for k := uint64(0); k < words && ok; k++ {
				v, got := devapi.LL16Read(rcv.LocalPackets+base+uintptr(k*devapi.LL16Size), flag, w)
				if !got {
					ok = false
					break
				}
				if uint32(v) != kernels.PatternValue(2*k, theirs) || uint32(v>>32) != kernels.PatternValue(2*k+1, theirs) {
					bad++
				}
			}
		} else {
			for k := uint64(0); k < words; k++ {
				devapi.LL8Store(snd.RemotePackets+base+uintptr(k*devapi.LL8Size), kernels.PatternValue(k, mine), flag)
			}
			for k := uint64(0); k < words && ok; k++ {
				v, got := devapi.LL8Read(rcv.LocalPackets+base+uintptr(k*devapi.LL8Size), flag, w)
				if !got {
					ok = false
					break
				}
				if v != kernels.PatternValue(k, theirs) {
					bad++
				}
			}
		}
		if ok {
			rounds++
		}
		last = flag
		flag = devapi.FlagNext(flag)
	}
	devapi.U64(out).Add(bad)
	if !ok {
		devapi.U64(out + 8).Add(1)
	}
	devapi.U64(out + 16).Store(rounds)
	devapi.U64(out + 24).Store(uint64(time.Since(start)))
	devapi.FlagEnd(rcv.Flag, last)
	return nil
}

func compareTwin(l *device.HostLaunch) error {
	a := l.Args
	got, want, n, guard, before, after, out := a.GetPtr(0), a.GetPtr(1), a.GetU64(2), byte(a.GetU32(3)), a.GetU64(4), a.GetU64(5), a.GetPtr(6)
	var bad, trampled uint64
	g, w := devapi.Bytes(got, n), devapi.Bytes(want, n)
	if !bytes.Equal(g, w) {
		for i := range g {
			if g[i] != w[i] {
				bad++
			}
		}
	}
	for _, b := range devapi.Bytes(got-uintptr(before), before) {
		if b != guard {
			trampled++
		}
	}
	for _, b := range devapi.Bytes(got+uintptr(n), after) {
		if b != guard {
			trampled++
		}
	}
	devapi.U64(out).Add(bad)
	devapi.U64(out + 8).Add(trampled)
	return nil
}
