package collectives_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/device"
)

// Class 1: every exported method answers on a nil receiver, with an error
// or a zero value.
func TestNilReceivers(t *testing.T) {
	// The table of every exported type with methods (nil pointers, zero and
	// out-of-range values); the guard fails when a new one is not added.
	apicheck.Cover(t, ".", []any{(*collectives.Communicator)(nil), (*collectives.Work)(nil), (*collectives.Registration)(nil),
		(*collectives.Tuning)(nil), &collectives.Tuning{}, (*collectives.MismatchError)(nil), &collectives.MismatchError{}, collectives.Kind(0), collectives.Kind(-1), collectives.Kind(1 << 20)},
		apicheck.Options{})
	var c *collectives.Communicator
	_, err := c.AllReduce(context.Background(), nil, 1, 1, 1, collectives.FP32, collectives.Sum)
	require.ErrorIs(t, err, collectives.ErrNil)
	require.ErrorIs(t, c.Close(), collectives.ErrNil)
}

// Class 1: after Close every method of the communicator, of its Work
// handles and of its registrations answers without a panic; calls fail
// with ErrClosed.
func TestUseAfterClose(t *testing.T) {
	for _, w := range hostWorlds[:1] {
		run(t, w, hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
			buf, err := c.Device().Alloc(4096)
			if err != nil {
				return err
			}
			reg, err := c.Register(ctx, buf)
			if err != nil {
				return err
			}
			work, err := c.AllReduce(ctx, nil, buf.Ptr, buf.Ptr, 64, collectives.FP32, collectives.Sum)
			if err != nil {
				return err
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			// Accessors polled from another goroutine while Close runs
			// (under -race: Close must not free or rewrite what they read
			// unguarded).
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					_ = c.Rank() + c.Size()
					_ = c.Check()
					_ = c.Device()
					_ = c.Config()
					_ = c.Tuning()
					_ = c.Channels()
					_ = work.Done()
					_ = work.Err()
					_ = reg.ID()
				}
			}()
			err = c.Close()
			stop.Store(true)
			wg.Wait()
			if err != nil {
				return err
			}
			for _, v := range []any{c, work, reg} {
				for _, f := range apicheck.Call(v, apicheck.Options{}) {
					t.Error(f)
				}
			}
			if _, err := c.AllReduce(ctx, nil, buf.Ptr, buf.Ptr, 64, collectives.FP32, collectives.Sum); !errors.Is(err, collectives.ErrClosed) {
				t.Errorf("AllReduce after Close: %v, want ErrClosed", err)
			}
			if _, err := c.Register(ctx, buf); !errors.Is(err, collectives.ErrClosed) {
				t.Errorf("Register after Close: %v, want ErrClosed", err)
			}
			return nil
		})
	}
}

// Class 2: sizes whose byte counts overflow are refused before anything
// runs, on every rank, however the product wraps.
func TestOverflowingSizesRefused(t *testing.T) {
	w := hostWorlds[1] // 3 ranks: W*n wraps for counts a 2-rank world would not
	run(t, w, hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		buf, err := c.Device().Alloc(4096)
		if err != nil {
			return err
		}
		defer c.Device().Free(buf)
		p := buf.Ptr
		for _, count := range []int{math.MaxInt, math.MaxInt/2 + 1, math.MaxInt/4 + 1, math.MaxInt / 3, 1 << 62, 1<<61 + 1} {
			for _, k := range collectives.Kinds {
				var err error
				switch k {
				case collectives.AllReduce:
					_, err = c.AllReduce(ctx, nil, p, p, count, collectives.FP32, collectives.Sum)
				case collectives.AllGather:
					_, err = c.AllGather(ctx, nil, p, p+1024, count, collectives.BF16)
				case collectives.ReduceScatter:
					_, err = c.ReduceScatter(ctx, nil, p, p+1024, count, collectives.FP32, collectives.Max)
				}
				if err == nil {
					t.Errorf("rank %d: %s of %d elements accepted", c.Rank(), k, count)
				} else if !strings.Contains(err.Error(), "overflow") && !strings.Contains(err.Error(), "past the end") {
					t.Errorf("rank %d: %s of %d elements: %v (want an overflow or range error)", c.Rank(), k, count, err)
				}
			}
		}
		return c.Barrier(ctx)
	})
}

// Class 5: on the host backend the communicator checks pointers as the
// CUDA path does: unmapped memory and ranges past an allocation are errors,
// not a crash or a silent read of a neighbour.
func TestHostPointersChecked(t *testing.T) {
	run(t, hostWorlds[0], hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		buf, err := c.Device().Alloc(4096)
		if err != nil {
			return err
		}
		freed, err := c.Device().Alloc(4096)
		if err != nil {
			return err
		}
		if err := c.Device().Free(freed); err != nil {
			return err
		}
		stack := make([]byte, 4096)
		for _, tc := range []struct {
			name       string
			send, recv uintptr
			count      int
		}{
			{"unmapped send", 0xdead0000, buf.Ptr, 16},
			{"Go memory as recv", buf.Ptr, hostPtr(stack), 16},
			{"freed send", freed.Ptr, buf.Ptr, 16},
			{"past the end", buf.Ptr + 4000, buf.Ptr + 4000, 64},
		} {
			_, err := c.AllReduce(ctx, nil, tc.send, tc.recv, tc.count, collectives.FP32, collectives.Sum)
			if err == nil || !errors.Is(err, device.ErrBadPointer) {
				t.Errorf("rank %d: %s: %v, want a pointer error", c.Rank(), tc.name, err)
			}
		}
		return c.Barrier(ctx)
	})
}

// Class 7: a cancelled context is refused before anything is launched, and
// the other ranks are not left half-way (every rank sees the same refusal).
func TestCancelledContextRefused(t *testing.T) {
	run(t, hostWorlds[0], hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		buf, err := c.Device().Alloc(4096)
		if err != nil {
			return err
		}
		dead, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := c.AllReduce(dead, nil, buf.Ptr, buf.Ptr, 16, collectives.FP32, collectives.Sum); !errors.Is(err, context.Canceled) {
			t.Errorf("rank %d: call on a cancelled context: %v", c.Rank(), err)
		}
		if err := c.Barrier(dead); !errors.Is(err, context.Canceled) {
			t.Errorf("rank %d: barrier on a cancelled context: %v", c.Rank(), err)
		}
		// Still usable: the refusal launched nothing.
		if _, err := c.AllReduce(ctx, nil, buf.Ptr, buf.Ptr, 16, collectives.FP32, collectives.Sum); err != nil {
			return err
		}
		return c.Barrier(ctx)
	})
}

// Class 3: configurations that must agree are compared in New, which
// names the field and the ranks on every rank.
func TestConfigMismatchNamed(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(c *collectives.Config)
	}{
		{"ScratchBytes", func(c *collectives.Config) { c.ScratchBytes *= 2 }},
		{"PacketBytes", func(c *collectives.Config) { c.PacketBytes *= 2 }},
		{"MaxBlocks", func(c *collectives.Config) { c.MaxBlocks = 2 }},
		{"LLMaxBlocks", func(c *collectives.Config) { c.LLMaxBlocks = 1 }},
		{"Threads", func(c *collectives.Config) { c.Threads = 128 }},
		{"MaxRegistrations", func(c *collectives.Config) { c.MaxRegistrations = 7 }},
		{"NCCL", func(c *collectives.Config) { c.NCCL = collectives.NCCLOff }},
		{"Debug", func(c *collectives.Config) { c.Debug = true }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			odd := 2
			errs := colltest.RunLocalWith(ctx, device.Host, 3, bootstrap.Config{Timeout: 30 * time.Second},
				func(r int) collectives.Config {
					cfg := hostConfig()
					if r == odd {
						tc.set(&cfg)
					}
					return cfg
				}, func(ctx context.Context, c *collectives.Communicator) error { return nil })
			for r, err := range errs {
				require.Error(t, err, "rank %d", r)
				require.ErrorContains(t, err, tc.field, "rank %d", r)
				require.ErrorContains(t, err, "rank 2", "rank %d: the odd rank is named", r)
				require.ErrorIs(t, err, collectives.ErrConfigMismatch, "rank %d", r)
			}
		})
	}
}
