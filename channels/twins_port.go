package channels

import (
	"time"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Twins of kernels/port_kernels.cu and kernels/proxy_kernels.cu, written in
// devapi's port channel API. Blocks run one after another and threads of a
// block collapse into one loop, as in twins.go.

func portAt(base uintptr, i uint32) devapi.PortChannel {
	p := base + uintptr(i)*devapi.PortChannelSize
	return devapi.DecodePortChannel(device.HostSlice[byte](p, devapi.PortChannelSize))
}

// portSeed is goep_port_seed.
func portSeed(seed, rank, i uint32) uint32 {
	return seed ^ (rank * 0x9e3779b9) ^ (i * 0x85ebca6b) ^ 0x27d4eb2f
}

// portByte is goep_port_byte: byte j of the port checks' pattern with seed s.
func portByte(s uint32, j uint64) byte { return byte(kernels.PatternValue(j>>2, s) >> (8 * (j & 3))) }

// portAddValue is goep_port_add_value.
func portAddValue(s uint32, i uint64) uint64 {
	return uint64(kernels.PatternValue(2*i, s)) | uint64(kernels.PatternValue(2*i+1, s))<<32
}

func init() {
	// goep_proxy_atomic_add(u64* p, u64 v)
	device.RegisterHostKernel(devapi.KernelProxyAtomicAdd, func(l *device.HostLaunch) error {
		devapi.U64(l.Args.GetPtr(0)).Add(l.Args.GetU64(1))
		return nil
	})
	device.RegisterHostKernel(devapi.KernelPortStream, portStreamTwin)
	// goep_port_atomic_storm(chans, u32 n, u32 me, u64 adds, u64 counter_off, u32 ncounters, u32 seed, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelPortAtomicStorm, func(l *device.HostLaunch) error {
		a := l.Args
		n, me, adds, off, nc, stage, out := a.GetU32(1), a.GetU32(2), a.GetU64(3), a.GetU64(4), uint64(a.GetU32(5)), a.GetU32(7), a.GetPtr(8)
		s := portSeed(a.GetU32(6), me, 0)
		for i := uint64(0); i < adds; i++ {
			peer := (me + 1 + uint32(i%uint64(n-1))) % n
			ch := portAt(a.GetPtr(0), peer)
			if !devapi.PortAtomicAdd(ch, ch.Dst, off+8*((i/uint64(n-1))%nc), portAddValue(s, i), stage) {
				devapi.U64(out).Add(1)
				return nil
			}
		}
		return nil
	})
	// goep_port_flush_all(chans, u32 n, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelPortFlushAll, func(l *device.HostLaunch) error {
		a := l.Args
		for t := range min(a.GetU32(1), uint32(blocks(l.Grid)*max(l.Block.X, 1))) {
			ch := portAt(a.GetPtr(0), t)
			if ch.Fifo.Triggers != 0 && !devapi.PortFlush(ch, a.GetU32(2)) {
				devapi.U64(a.GetPtr(3)).Add(1)
			}
		}
		return nil
	})
	// goep_port_pingpong(chans, u32 idx, u64 iters, u32 initiator, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelPortPingPong, func(l *device.HostLaunch) error {
		a := l.Args
		ch, iters, initiator, stage, out := portAt(a.GetPtr(0), a.GetU32(1)), a.GetU64(2), a.GetU32(3) != 0, a.GetU32(4), a.GetPtr(5)
		var done uint64
		start := time.Now()
		for range iters {
			var ok bool
			if initiator {
				ok = devapi.PortSignal(ch, stage) && devapi.PortWait(ch, stage)
			} else {
				ok = devapi.PortWait(ch, stage) && devapi.PortSignal(ch, stage)
			}
			if !ok {
				break
			}
			done++
		}
		devapi.U64(out).Store(done)
		devapi.U64(out + 8).Store(uint64(time.Since(start)))
		return nil
	})
	// goep_port_put_bench(chans, u32 idx, u64 dst_off, u64 src_off, u64 bytes, u32 iters, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelPortPutBench, func(l *device.HostLaunch) error {
		a := l.Args
		ch, dst, src, n, iters, stage, out := portAt(a.GetPtr(0), a.GetU32(1)), a.GetU64(2), a.GetU64(3), a.GetU64(4), a.GetU32(5), a.GetU32(6), a.GetPtr(7)
		start := time.Now()
		ok := true
		for i := uint32(0); i < iters && ok; i++ {
			ok = devapi.PortPut(ch, dst, src, n, 0, stage)
		}
		ok = ok && devapi.PortFlush(ch, stage)
		devapi.U64(out).Store(b2u(ok))
		devapi.U64(out + 8).Store(uint64(time.Since(start)))
		return nil
	})
	// goep_port_atomic_rate(chans, u32 idx, u64 adds, u64 counter_off, u32 ncounters, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelPortAtomicRate, func(l *device.HostLaunch) error {
		a := l.Args
		ch, adds, off, nc, stage, out := portAt(a.GetPtr(0), a.GetU32(1)), a.GetU64(2), a.GetU64(3), uint64(a.GetU32(4)), a.GetU32(5), a.GetPtr(6)
		start := time.Now()
		ok := true
		for k := uint64(0); k < adds && ok; k++ {
			ok = devapi.PortAtomicAdd(ch, ch.Dst, off+8*(k%nc), 1, stage)
		}
		if !ok || !devapi.PortFlush(ch, stage) {
			devapi.U64(out).Add(1)
		}
		devapi.U64(out + 8).Store(uint64(time.Since(start)))
		return nil
	})
	// goep_port_signal_burst(chans, u32 idx, u32 count, u32 flush, u32 stage, u64* out)
	device.RegisterHostKernel(devapi.KernelPortSignalBurst, func(l *device.HostLaunch) error {
		a := l.Args
		ch, count, flush, stage, out := portAt(a.GetPtr(0), a.GetU32(1)), a.GetU32(2), a.GetU32(3) != 0, a.GetU32(4), a.GetPtr(5)
		var pushed uint64
		ok := true
		for i := uint32(0); i < count && ok; i++ {
			if ok = devapi.PortSignal(ch, stage); ok {
				pushed++
			}
		}
		if ok && flush {
			ok = devapi.PortFlush(ch, stage)
		}
		devapi.U64(out).Store(pushed)
		devapi.U64(out + 8).Store(b2u(ok))
		return nil
	})
}

// goep_port_stream(chans, u32 to, u32 from, u32 me, u8* local, const u32* plan, u32 iters, u32 seed,
// u64 src_base, u64 dst_base, u32 stage, u64* out)
func portStreamTwin(l *device.HostLaunch) error {
	a := l.Args
	tx, rx := portAt(a.GetPtr(0), a.GetU32(1)), portAt(a.GetPtr(0), a.GetU32(2))
	from, me, local, plan, iters, seed := a.GetU32(2), a.GetU32(3), a.GetPtr(4), a.GetPtr(5), a.GetU32(6), a.GetU32(7)
	srcBase, dstBase, stage, out := a.GetU64(8), a.GetU64(9), a.GetU32(10), a.GetPtr(11)
	p := device.HostSlice[uint32](plan, int(4*iters))
	var bad, rounds uint64
	gaveUp := false
	start := time.Now()
	for i := uint32(0); i < iters; i++ {
		size, soff, doff, flavour := uint64(p[4*i]), srcBase+uint64(p[4*i+1]), dstBase+uint64(p[4*i+2]), p[4*i+3]&3
		mine, theirs := portSeed(seed, me, i), portSeed(seed, from, i)
		src := devapi.Bytes(local+uintptr(soff), size)
		for j := range src {
			src[j] = portByte(mine, uint64(j))
		}
		var ok bool
		switch flavour {
		case 0:
			ok = devapi.PortPut(tx, doff, soff, size, devapi.TriggerSignal, stage)
		case 1:
			ok = devapi.PortPut(tx, doff, soff, size, 0, stage) && devapi.PortSignal(tx, stage)
		case 2:
			ok = devapi.PortPut(tx, doff, soff, size, devapi.TriggerSignal|devapi.TriggerFlush, stage)
		default:
			h := size / 2
			ok = devapi.PortPut(tx, doff, soff, h, 0, stage) && devapi.PortPut(tx, doff+h, soff+h, size-h, 0, stage) &&
				devapi.PortSignal(tx, stage)
		}
		if !ok || !devapi.PortWait(rx, stage) {
			gaveUp = true
			break
		}
		for j, b := range devapi.Bytes(local+uintptr(doff), size) {
			if b != portByte(theirs, uint64(j)) {
				bad++
			}
		}
		if !devapi.PortSignal(rx, stage) || !devapi.PortWait(tx, stage) {
			gaveUp = true
			break
		}
		rounds++
	}
	devapi.U64(out).Add(bad)
	devapi.U64(out + 8).Store(rounds)
	devapi.U64(out + 16).Store(b2u(gaveUp))
	devapi.U64(out + 24).Store(uint64(time.Since(start)))
	return nil
}
