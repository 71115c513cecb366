//go:build goep_cpuemu

package cpuemu

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

func TestGeneratedFileIsFresh(t *testing.T) {
	out, err := exec.Command("go", "run", "gen.go", "-check").CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// config keeps the emulation small: 64 threads, 2 blocks, small buffers (a
// 96 KiB scratch makes the scratch kernels run several rounds from a few
// KiB on).
func config() collectives.Config {
	return collectives.Config{
		Channels:     channels.Config{Timeouts: channels.Timeouts{Wait: 60 * time.Second}},
		ScratchBytes: 96 << 10, PacketBytes: 512 << 10, MaxBlocks: 2, LLMaxBlocks: 2, Threads: 64,
		NCCL: collectives.NCCLOff,
	}
}

func runEmu(t *testing.T, ranks int, fn func(ctx context.Context, c *collectives.Communicator) error) {
	t.Helper()
	runEmuWith(t, ranks, config(), fn)
}

func runEmuWith(t *testing.T, ranks int, cfg collectives.Config, fn func(ctx context.Context, c *collectives.Communicator) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	open := func(r int) (device.Device, error) { return Open(r, 2), nil }
	errs := colltest.RunDevices(ctx, ranks, open, bootstrap.Config{Timeout: 5 * time.Minute},
		func(int) collectives.Config { return cfg }, fn)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// Every algorithm of every collective, sizes around the vector, word,
// piece and round boundaries, every type and reduction, in and out of
// place, aligned and not, on 2 and 3 ranks (3: pieces that do not divide).
func TestKernelsMatchReference(t *testing.T) {
	for _, ranks := range []int{2, 3} {
		t.Run(fmt.Sprint(ranks), func(t *testing.T) {
			runEmu(t, ranks, func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
				if err != nil {
					return err
				}
				defer b.Free()
				seed := uint32(1)
				for _, k := range collectives.Kinds {
					for _, a := range collectives.Algorithms(k) {
						if a == collectives.AlgoNCCL {
							continue
						}
						dts := []ref.DataType{ref.BF16, ref.FP16, ref.FP32}
						if k == collectives.AllGather {
							dts = append(dts, ref.FP8E4M3)
						}
						for _, dt := range dts {
							ops := ref.Ops
							if k == collectives.AllGather {
								ops = ops[:1]
							}
							for _, op := range ops {
								for i, n := range []int{1, 3, 8, 17, 100, 1023, 4100, 20011} {
									seed++
									cs := colltest.Case{Kind: k, Algorithm: a, Count: n, DType: dt, Op: op, Seed: seed,
										InPlace: i%3 == 1, Offset: []int{0, 0, 1, 8}[i%4]}
									if _, err := b.Check(ctx, cs); err != nil {
										return err
									}
								}
							}
						}
					}
				}
				return nil
			})
		})
	}
}

// Back-to-back calls that switch algorithms every call, and graph replays.
func TestBackToBackAndGraphs(t *testing.T) {
	runEmu(t, 3, func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
		if err != nil {
			return err
		}
		defer b.Free()
		for _, k := range collectives.Kinds {
			algos := []string{collectives.AlgoLL, collectives.AlgoScratch, collectives.AlgoZC}
			if k == collectives.AllReduce {
				algos = append(algos, collectives.AlgoLL2)
			}
			cs := colltest.Case{Kind: k, Count: 3001, DType: ref.BF16, Op: ref.Sum, Seed: 77}
			if _, err := b.BackToBack(ctx, cs, 40, algos); err != nil {
				return err
			}
			for _, a := range algos {
				cs.Algorithm = a
				if err := b.GraphPair(ctx, cs, 5); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Another grid geometry: 4 ranks, 96-thread blocks (three warps), 3 blocks,
// a scratch that forces many rounds.
func TestOddGeometry(t *testing.T) {
	cfg := config()
	cfg.Threads, cfg.MaxBlocks, cfg.LLMaxBlocks, cfg.ScratchBytes = 96, 3, 3, 64<<10
	runEmuWith(t, 4, cfg, func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
		if err != nil {
			return err
		}
		defer b.Free()
		seed := uint32(900)
		for _, k := range collectives.Kinds {
			for _, a := range collectives.Algorithms(k) {
				if a == collectives.AlgoNCCL {
					continue
				}
				for i, n := range []int{1, 9, 333, 5005, 30011} {
					for _, dt := range []ref.DataType{ref.BF16, ref.FP32} {
						seed++
						cs := colltest.Case{Kind: k, Algorithm: a, Count: n, DType: dt, Op: ref.Sum, Seed: seed, InPlace: i%2 == 1}
						if !b.Fits(cs) {
							continue
						}
						if _, err := b.Check(ctx, cs); err != nil {
							return err
						}
					}
				}
			}
		}
		return nil
	})
}
