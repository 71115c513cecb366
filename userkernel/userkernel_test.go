package userkernel_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/userkernel"
)

// A user kernel reads the fields of the handles it is given, through the
// structs of goep's header, and writes them out; they must be what the Go
// side says each channel is (its id, its peer, its proxy channel index and
// memories, its buffer sizes and addresses). This holds the header's
// layout, the Go encoding and the upload to each other end to end.
const abiProbe = `#include "channel_device.cuh"
extern "C" __global__ void uk_abi_probe(const goep_port_channel* pc, const goep_memory_channel* mc, const goep_semaphore* sems,
                                        u32 n, u64* out) {
  const u32 p = threadIdx.x;
  if (p >= n) return;
  u64* o = out + 8 * p;
  o[0] = pc[p].sem.id;
  o[1] = pc[p].sem.peer;
  o[2] = (u64)pc[p].channel | (u64)pc[p].dst << 16 | (u64)pc[p].src << 32;
  o[3] = mc[p].sem.id;
  o[4] = mc[p].sem.peer;
  o[5] = (u64)mc[p].remote;
  o[6] = mc[p].local_size;
  o[7] = sems[p].id;
}
`

func TestHandlesThroughAUserKernel(t *testing.T) {
	for _, b := range kernelBackends(t) {
		t.Run(string(b), func(t *testing.T) {
			noErrors(t, runRanks(t, b, 3, time.Minute, func(ctx context.Context, comm *channels.Communicator) (err error) {
				n, me := comm.Size(), comm.Rank()
				mod, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "abi_probe", Code: abiProbe})
				if err != nil {
					return err
				}
				dev := comm.Device()
				buf, err := dev.Alloc(4096 + 512*me)
				if err != nil {
					return err
				}
				out, err := dev.Alloc(8 * 8 * n)
				if err != nil {
					return errors.Join(err, dev.Free(buf))
				}
				proxy, err := comm.NewProxy(channels.ProxyConfig{})
				if err != nil {
					return errors.Join(err, dev.Free(buf), dev.Free(out))
				}
				defer func() { err = errors.Join(err, proxy.Close(), dev.Free(buf), dev.Free(out)) }()
				mem, err := comm.RegisterMemory(buf)
				if err != nil {
					return err
				}
				pm, err := proxy.NewPortChannelMesh(ctx, channels.PortMeshConfig{Tag: 5, Local: mem})
				if err != nil {
					return err
				}
				mm, err := comm.NewMemoryChannelMesh(ctx, channels.MeshConfig{Tag: 6, Local: mem})
				if err != nil {
					return err
				}
				ports, mems := pm.ByRank(n), mm.ByRank(n)
				pa, err := comm.UploadPortChannels(ports)
				if err != nil {
					return err
				}
				ma, err := comm.UploadMemoryChannels(mems)
				if err != nil {
					return err
				}
				sems := make([][]byte, n)
				for p, c := range mems {
					if c != nil {
						sems[p] = c.Semaphore().DeviceHandleBytes()
					}
				}
				sa, err := comm.UploadHandleBytes(channels.SemaphoreHandleSize, sems)
				if err != nil {
					return err
				}
				if err := comm.Barrier(ctx); err != nil {
					return err
				}
				args := userkernel.NewArgs(5).Ptr(pa.Ptr()).Ptr(ma.Ptr()).Ptr(sa.Ptr()).U32(uint32(n)).Ptr(out.Ptr)
				if err := mod.Launch("uk_abi_probe", userkernel.Launch{Grid: userkernel.D1(1), Block: userkernel.D1(32), NoPeerWaits: true}, args); err != nil {
					return err
				}
				if err := mod.Synchronize(nil); err != nil {
					return err
				}
				raw := make([]byte, 8*8*n)
				if err := dev.CopyOut(raw, out.Ptr); err != nil {
					return err
				}
				for p := 0; p < n; p++ {
					got := make([]uint64, 8)
					for i := range got {
						got[i] = binary.LittleEndian.Uint64(raw[8*(8*p+i):])
					}
					want := make([]uint64, 8)
					if p != me {
						pc, mc := ports[p], mems[p]
						want = []uint64{uint64(pc.ID()), uint64(p), uint64(pm.Channels[indexOf(pm.Peers, p)].DeviceHandle().Channel) |
							uint64(pc.Dst())<<16 | uint64(pc.Src())<<32, uint64(mc.ID()), uint64(p), uint64(mm.Remote[indexOf(mm.Peers, p)].Ptr()),
							uint64(4096 + 512*me), uint64(mc.Semaphore().ID())}
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						return fmt.Errorf("rank %d, slot %d: the kernel read %v from the handles, the Go side says %v", me, p, got, want)
					}
				}
				return comm.Barrier(ctx)
			}))
		})
	}
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// A kernel waiting on a peer that never signals ends with the
// communicator's timeout, naming the port channel, the peer, the stage and
// the wait, and the communicator then refuses launches; not a hang.
const waitSrc = `#include "channel_device.cuh"
extern "C" __global__ void uk_wait_forever(const goep_port_channel* chans, u32 peer, u32* gave_up) {
  if (threadIdx.x == 0 && !goep_pc_wait(chans[peer], 7)) *gave_up = 1;
}
`

func TestWaitOnSilentPeerTimesOut(t *testing.T) {
	for _, b := range kernelBackends(t) {
		t.Run(string(b), func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			noErrors(t, runRanks(t, b, 2, timeout, func(ctx context.Context, comm *channels.Communicator) (err error) {
				mod, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "wait", Code: waitSrc})
				if err != nil {
					return err
				}
				dev := comm.Device()
				buf, err := dev.Alloc(4096)
				if err != nil {
					return err
				}
				defer func() { err = errors.Join(err, dev.Free(buf)) }()
				proxy, err := comm.NewProxy(channels.ProxyConfig{})
				if err != nil {
					return err
				}
				defer func() { err = errors.Join(err, proxy.Close()) }()
				mem, err := comm.RegisterMemory(buf)
				if err != nil {
					return err
				}
				mesh, err := proxy.NewPortChannelMesh(ctx, channels.PortMeshConfig{Tag: 9, Local: mem})
				if err != nil {
					return err
				}
				arr, err := comm.UploadPortChannels(mesh.ByRank(2))
				if err != nil {
					return err
				}
				if err := proxy.Start(); err != nil {
					return err
				}
				if err := comm.Barrier(ctx); err != nil {
					return err
				}
				// The communicator refuses calls after the timeout: the ranks
				// meet at the end over the bootstrap.
				bs := comm.Bootstrap()
				if comm.Rank() == 1 {
					return bs.Barrier(ctx) // the silent peer
				}
				args := userkernel.NewArgs(3).Ptr(arr.Ptr()).U32(1).Ptr(buf.Ptr)
				if err := mod.Launch("uk_wait_forever", userkernel.Launch{Grid: userkernel.D1(1), Block: userkernel.D1(32)}, args); err != nil {
					return err
				}
				start := time.Now()
				werr := mod.Synchronize(nil)
				var te *channels.TimeoutError
				switch {
				case !errors.As(werr, &te):
					return fmt.Errorf("synchronize after a wait nobody satisfies: %v, want a *channels.TimeoutError", werr)
				case te.Peer != 1 || te.Stage != 7 || te.Op != "semaphore wait" || te.ID != mesh.Channels[0].ID() ||
					!strings.Contains(te.Object, "port channel"):
					return fmt.Errorf("timeout %+v does not name the port channel %d to rank 1, stage 7, semaphore wait", te, mesh.Channels[0].ID())
				case time.Since(start) > 10*time.Minute:
					return errors.New("the wait was not bounded")
				}
				var flag [4]byte
				if err := dev.CopyOut(flag[:], buf.Ptr); err != nil {
					return err
				}
				if binary.LittleEndian.Uint32(flag[:]) != 1 {
					return errors.New("the kernel's wait did not return false")
				}
				lerr := mod.Launch("uk_wait_forever", userkernel.Launch{Grid: userkernel.D1(1), Block: userkernel.D1(32)}, args)
				if !errors.Is(lerr, channels.ErrTimeout) {
					return fmt.Errorf("a launch after the timeout: %v, want the timeout again", lerr)
				}
				return bs.Barrier(ctx)
			}))
		})
	}
}

// A source that does not compile fails Load with the compiler's
// diagnostics, citing the user's file name and line (NVRTC's log on GPUs,
// g++'s output in the emulation); a fixed source may then reuse the kernel
// name.
func TestCompileErrorCarriesTheLog(t *testing.T) {
	for _, b := range kernelBackends(t) {
		t.Run(string(b), func(t *testing.T) {
			bad := "#include \"channel_device.cuh\"\nextern \"C\" __global__ void uk_broken_" + string(b) + "(u32* p) {\n  *p = no_such_function_here(3);\n}\n"
			errs := runRanks(t, b, 1, time.Minute, func(ctx context.Context, comm *channels.Communicator) error {
				_, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "broken", Code: bad})
				if err == nil {
					return errors.New("a broken source loaded")
				}
				msg := err.Error()
				if b == gpu {
					var ce *kernels.CompileError
					if !errors.As(err, &ce) || !strings.Contains(ce.Log, "broken.cu(3)") {
						return fmt.Errorf("NVRTC error without the log citing broken.cu(3): %v", err)
					}
				} else if !strings.Contains(msg, "broken.cu:3") {
					return fmt.Errorf("g++ error without broken.cu:3: %v", err)
				}
				if !strings.Contains(msg, "no_such_function_here") {
					return fmt.Errorf("the error does not name the culprit: %v", err)
				}
				fixed := strings.Replace(bad, "no_such_function_here(3)", "3", 1)
				mod, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "broken", Code: fixed})
				if err != nil {
					return fmt.Errorf("the fixed source: %w", err)
				}
				dev := comm.Device()
				buf, err := dev.Alloc(4)
				if err != nil {
					return err
				}
				defer dev.Free(buf)
				if err := mod.Launch(mod.Kernels()[0], userkernel.Launch{Grid: userkernel.D1(1), Block: userkernel.D1(1)},
					userkernel.NewArgs(1).Ptr(buf.Ptr)); err != nil {
					return err
				}
				if err := mod.Synchronize(nil); err != nil {
					return err
				}
				var v [4]byte
				if err := dev.CopyOut(v[:], buf.Ptr); err != nil {
					return err
				}
				if binary.LittleEndian.Uint32(v[:]) != 3 {
					return fmt.Errorf("the fixed kernel wrote %d, want 3", binary.LittleEndian.Uint32(v[:]))
				}
				return nil
			})
			noErrors(t, errs)
		})
	}
}

// Load and Launch refuse bad input before anything runs.
func TestRefusals(t *testing.T) {
	_, err := userkernel.Load(context.Background(), nil, userkernel.Source{Name: "x", Code: waitSrc})
	assert.Error(t, err)
	var nilMod *userkernel.Module
	assert.Error(t, nilMod.Launch("k", userkernel.Launch{}, nil))
	assert.Error(t, nilMod.Synchronize(nil))
	assert.Empty(t, nilMod.Kernels())
	assert.Empty(t, nilMod.Name())

	const two = `extern "C" __global__ void uk_ref_a(int* p) { *p = 1; }
extern "C" __global__ void uk_ref_b(int* p) { *p = 2; }
`
	noErrors(t, runRanks(t, emu, 1, time.Minute, func(ctx context.Context, comm *channels.Communicator) error {
		for _, s := range []struct {
			src  userkernel.Source
			want string
		}{
			{userkernel.Source{Name: "", Code: two}, "the name must be"},
			{userkernel.Source{Name: "a/b", Code: two}, "the name must be"},
			{userkernel.Source{Name: "9lives", Code: two}, "the name must be"},
			{userkernel.Source{Name: "none", Code: "__global__ void k() {}"}, "defines no kernel"},
			{userkernel.Source{Name: "twice", Code: two + two}, "defined twice"},
		} {
			if _, err := userkernel.Load(ctx, comm, s.src); err == nil || !strings.Contains(err.Error(), s.want) {
				return fmt.Errorf("Load(%q): %v, want %q", s.src.Name, err, s.want)
			}
		}
		mod, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "refusals", Code: two})
		if err != nil {
			return err
		}
		if fmt.Sprint(mod.Kernels()) != "[uk_ref_a uk_ref_b]" || !strings.HasPrefix(mod.Name(), "refusals-") {
			return fmt.Errorf("module %s with kernels %v", mod.Name(), mod.Kernels())
		}
		one := userkernel.D1(1)
		for _, c := range []struct {
			kernel string
			l      userkernel.Launch
			want   string
		}{
			{"uk_ref_c", userkernel.Launch{Grid: one, Block: one}, "defines no such kernel"},
			{"uk_ref_a", userkernel.Launch{Grid: userkernel.D1(0), Block: one}, "non-positive"},
			{"uk_ref_a", userkernel.Launch{Grid: one, Block: userkernel.Dim3{X: 1, Y: -1}}, "non-positive"},
			{"uk_ref_a", userkernel.Launch{Grid: one, Block: userkernel.D1(1025)}, "more than 1024 threads"},
			{"uk_ref_a", userkernel.Launch{Grid: one, Block: userkernel.Dim3{X: 64, Y: 32}}, "more than 1024 threads"},
			{"uk_ref_a", userkernel.Launch{Grid: userkernel.Dim3{X: 1, Y: 70000}, Block: one}, "beyond CUDA's limits"},
			{"uk_ref_a", userkernel.Launch{Grid: one, Block: one, SharedMem: -1}, "negative shared memory"},
		} {
			if err := mod.Launch(c.kernel, c.l, userkernel.NewArgs(1).Ptr(0)); err == nil || !strings.Contains(err.Error(), c.want) {
				return fmt.Errorf("Launch(%s, %+v): %v, want %q", c.kernel, c.l, err, c.want)
			}
		}
		return nil
	}))
}

// ReadSource names the Source after its file.
func TestReadSource(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mine.cu")
	require.NoError(t, os.WriteFile(p, []byte(waitSrc), 0o644))
	s, err := userkernel.ReadSource(p)
	require.NoError(t, err)
	assert.Equal(t, "mine", s.Name)
	assert.Equal(t, waitSrc, s.Code)
	_, err = userkernel.ReadSource(filepath.Join(t.TempDir(), "absent.cu"))
	assert.Error(t, err)
}

// Ranks sharing a GPU: a launch of more blocks than the spin budget is
// refused before it runs, stating the budget, unless it declares that it
// waits on no other rank; a launch within the budget runs. GPU only (the
// host backends have no budget).
func TestSpinBudget(t *testing.T) {
	if len(kernelBackends(t)) < 2 {
		t.Skip("no GPU: the spin budget is a GPU matter")
	}
	const src = `extern "C" __global__ void uk_spin_budget_fill(unsigned* p) { p[blockIdx.x] = blockIdx.x + 1; }
`
	noErrors(t, runRanks(t, gpu, 8, time.Minute, func(ctx context.Context, comm *channels.Communicator) (err error) {
		mod, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "spin_budget", Code: src})
		if err != nil {
			return err
		}
		pl, err := comm.Placement(ctx)
		if err != nil {
			return err
		}
		if !pl.AnyShared {
			return comm.Barrier(ctx) // one GPU per rank: no budget to break
		}
		dev := comm.Device()
		sms := dev.Info().SMs
		buf, err := dev.Alloc(4 * sms)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, dev.Free(buf)) }()
		args := userkernel.NewArgs(1).Ptr(buf.Ptr)
		over := userkernel.Launch{Grid: userkernel.D1(sms), Block: userkernel.D1(32)}
		lerr := mod.Launch("uk_spin_budget_fill", over, args)
		if lerr == nil || !strings.Contains(lerr.Error(), fmt.Sprintf("at most %d blocks", pl.SpinBlocks)) {
			return fmt.Errorf("a %d-block launch with a budget of %d: %v, want a refusal stating the budget", sms, pl.SpinBlocks, lerr)
		}
		over.NoPeerWaits = true
		if err := mod.Launch("uk_spin_budget_fill", over, args); err != nil {
			return fmt.Errorf("a launch that waits on no rank: %w", err)
		}
		within := userkernel.Launch{Grid: userkernel.D1(pl.SpinBlocks), Block: userkernel.D1(32)}
		if err := mod.Launch("uk_spin_budget_fill", within, args); err != nil {
			return fmt.Errorf("a launch within the budget: %w", err)
		}
		if err := mod.Synchronize(nil); err != nil {
			return err
		}
		got := make([]byte, 4*sms)
		if err := dev.CopyOut(got, buf.Ptr); err != nil {
			return err
		}
		for i := 0; i < sms; i++ {
			if v := binary.LittleEndian.Uint32(got[4*i:]); v != uint32(i+1) {
				return fmt.Errorf("block %d wrote %d", i, v)
			}
		}
		return comm.Barrier(ctx)
	}))
}
