// Package tutorial is MSCCL++'s channel tutorial on goep: N ranks, one
// buffer each, channels from every rank to every other, and a user kernel
// (tutorial.cu, compiled at run time by package userkernel) in which rank r
// puts its slice of the buffer to every peer with a signal and waits for
// theirs. Port channels (the proxy moves the data with the copy engines:
// put with signal and flush) and memory channels (the SMs copy over NVLink)
// are both here. Run checks every byte that arrived against the pattern
// each sender wrote, computed here in Go.
//
// It runs on GPUs (goroutine ranks may share one) and, on machines without
// one, in goep's CPU emulation of the same source; the plain host backend
// refuses it with userkernel.ErrNeedsGPU. `ep-bench userkernel` runs it.
package tutorial

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/userkernel"
)

// Code is the tutorial's CUDA source, the user kernel.
//
//go:embed tutorial.cu
var Code string

// The kernels Code defines.
const (
	KernelPort   = "tutorial_port_all_gather"
	KernelMemory = "tutorial_memory_all_gather"
)

// Source is Code as a userkernel.Source.
func Source() userkernel.Source { return userkernel.Source{Name: "tutorial", Code: Code} }

// Channels picks the channel kind.
type Channels string

const (
	// Port channels: the CPU proxy moves the data with the copy engines.
	Port Channels = "port"
	// Memory channels: the kernel's threads move the data over NVLink.
	Memory Channels = "memory"
)

// Config shapes a run.
type Config struct {
	// Channels is Port or Memory; empty means Port.
	Channels Channels
	// SliceBytes is what each rank sends to every peer; 0 means 64 KiB.
	SliceBytes int
	// Rounds is how many times the exchange runs, each with new data; 0
	// means 1.
	Rounds int
	// Seed varies the data.
	Seed uint64
}

// Result is one rank's outcome.
type Result struct {
	Channels   Channels
	Ranks      int
	SliceBytes int
	Rounds     int
	// Elapsed is the time from each launch to its synchronisation, summed
	// over rounds (filling and checking the buffer excluded); it includes
	// the launch's wait for the slowest peer.
	Elapsed time.Duration
}

// meshTag pairs the tutorial's channel meshes between ranks, apart from
// what else the application builds on the communicator.
const meshTag = 0x7475746f

// maxBuffer bounds the buffer (ranks x slice): port channel offsets are
// below 4 GiB.
const maxBuffer = 1 << 32

// Run runs the tutorial on this rank: collective, every rank of comm calls
// it with the same Config. It fails on the first round whose data differs
// from what the peers sent, naming the peer, the round and the first byte;
// a peer that never signals ends in the communicator's named timeout.
// Give each Run a communicator of its own: Run frees its buffer, while the
// communicator keeps the peers' memory it opened until Close, so a later
// run's buffer allocated where an earlier one's was could be taken for it.
func Run(ctx context.Context, comm *channels.Communicator, cfg Config) (res Result, err error) {
	if comm == nil {
		return res, errors.New("tutorial: Run needs a communicator")
	}
	n, me := comm.Size(), comm.Rank()
	errorf := func(format string, a ...any) error {
		return fmt.Errorf("tutorial: rank %d: "+format, append([]any{me}, a...)...)
	}
	if cfg.Channels == "" {
		cfg.Channels = Port
	}
	if cfg.SliceBytes == 0 {
		cfg.SliceBytes = 64 << 10
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 1
	}
	switch {
	case cfg.Channels != Port && cfg.Channels != Memory:
		return res, errorf("channels %q: want %q or %q", cfg.Channels, Port, Memory)
	case n < 2:
		return res, errorf("the tutorial needs at least 2 ranks, the communicator has %d", n)
	case n > 1024:
		return res, errorf("%d ranks: one block serves every peer, 1024 at most", n)
	case cfg.SliceBytes < 0 || cfg.Rounds < 0:
		return res, errorf("negative slice %d or rounds %d", cfg.SliceBytes, cfg.Rounds)
	case cfg.SliceBytes > maxBuffer/n:
		return res, errorf("%d ranks x %d bytes exceed the %d-byte buffer limit", n, cfg.SliceBytes, int64(maxBuffer))
	}
	res = Result{Channels: cfg.Channels, Ranks: n, SliceBytes: cfg.SliceBytes, Rounds: cfg.Rounds}
	mod, err := userkernel.Load(ctx, comm, Source())
	if err != nil {
		return res, err
	}
	dev := comm.Device()
	size := n * cfg.SliceBytes
	buf, err := dev.Alloc(size)
	if err != nil {
		return res, errorf("buffer of %d bytes: %w", size, err)
	}
	defer func() {
		if ferr := dev.Free(buf); ferr != nil {
			err = errors.Join(err, errorf("free the buffer: %w", ferr))
		}
	}()
	failed, err := dev.Alloc(8)
	if err != nil {
		return res, errorf("failure counter: %w", err)
	}
	defer func() {
		if ferr := dev.Free(failed); ferr != nil {
			err = errors.Join(err, errorf("free the failure counter: %w", ferr))
		}
	}()
	mem, err := comm.RegisterMemory(buf)
	if err != nil {
		return res, err
	}
	var handles *channels.DeviceArray
	kernel := KernelPort
	if cfg.Channels == Port {
		var proxy *channels.Proxy
		if proxy, err = comm.NewProxy(channels.ProxyConfig{}); err != nil {
			return res, err
		}
		// Closed before the buffer is freed (defers run last first): its
		// copies read and write the buffer.
		defer func() { err = errors.Join(err, proxy.Close()) }()
		var mesh *channels.PortMesh
		if mesh, err = proxy.NewPortChannelMesh(ctx, channels.PortMeshConfig{Tag: meshTag, Local: mem}); err != nil {
			return res, err
		}
		if handles, err = comm.UploadPortChannels(mesh.ByRank(n)); err != nil {
			return res, err
		}
		defer func() { err = errors.Join(err, handles.Close()) }()
		if err = proxy.Start(); err != nil {
			return res, err
		}
	} else {
		kernel = KernelMemory
		var mesh *channels.Mesh
		if mesh, err = comm.NewMemoryChannelMesh(ctx, channels.MeshConfig{Tag: meshTag, Local: mem}); err != nil {
			return res, err
		}
		if handles, err = comm.UploadMemoryChannels(mesh.ByRank(n)); err != nil {
			return res, err
		}
		defer func() { err = errors.Join(err, handles.Close()) }()
	}

	block := (n + 31) / 32 * 32
	host := make([]byte, size)
	for round := 0; round < cfg.Rounds; round++ {
		// This rank's slice holds its data, every other slice the
		// complement of what its sender will put there, so a put that
		// never landed cannot pass for one that did.
		for p := 0; p < n; p++ {
			fill(host[p*cfg.SliceBytes:(p+1)*cfg.SliceBytes], cfg.Seed, round, p, p != me)
		}
		if err := dev.CopyIn(buf.Ptr, host); err != nil {
			return res, errorf("round %d: fill: %w", round, err)
		}
		if err := dev.CopyIn(failed.Ptr, make([]byte, 8)); err != nil {
			return res, errorf("round %d: %w", round, err)
		}
		// Every rank has filled its buffer (and checked the last round's)
		// before any rank puts into it.
		if err := comm.Barrier(ctx); err != nil {
			return res, err
		}
		start := time.Now()
		args := userkernel.NewArgs(5).Ptr(handles.Ptr()).U32(uint32(me)).U32(uint32(n)).U64(uint64(cfg.SliceBytes)).Ptr(failed.Ptr)
		if err := mod.Launch(kernel, userkernel.Launch{Grid: userkernel.D1(1), Block: userkernel.D1(block)}, args); err != nil {
			return res, err
		}
		if err := mod.Synchronize(nil); err != nil {
			return res, err
		}
		res.Elapsed += time.Since(start)
		var f [8]byte
		if err := dev.CopyOut(f[:], failed.Ptr); err != nil {
			return res, errorf("round %d: %w", round, err)
		}
		if k := binary.LittleEndian.Uint32(f[:]); k != 0 {
			return res, errorf("round %d: %d of the kernel's waits gave up, and the communicator reports no timeout", round, k)
		}
		if err := dev.CopyOut(host, buf.Ptr); err != nil {
			return res, errorf("round %d: read the buffer: %w", round, err)
		}
		want := make([]byte, cfg.SliceBytes)
		for p := 0; p < n; p++ {
			fill(want, cfg.Seed, round, p, false)
			got := host[p*cfg.SliceBytes : (p+1)*cfg.SliceBytes]
			for j := range want {
				if got[j] != want[j] {
					return res, errorf("round %d: slice of rank %d (%s channels): byte %d is %#02x, the sender wrote %#02x",
						round, p, cfg.Channels, j, got[j], want[j])
				}
			}
		}
	}
	// No rank frees what a peer may still reach until every rank is done.
	if err := comm.Barrier(ctx); err != nil {
		return res, err
	}
	return res, nil
}

// fill writes rank p's data of a round into b (complemented when
// complement is set): a splitmix64 stream keyed by seed, round and rank.
func fill(b []byte, seed uint64, round, p int, complement bool) {
	x := seed ^ uint64(round)*0x9e3779b97f4a7c15 ^ uint64(p)*0xbf58476d1ce4e5b9
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		if complement {
			z = ^z
		}
		binary.LittleEndian.PutUint64(w[:], z)
		copy(b[i:], w[:])
	}
}
