package core

import (
	"context"
	"fmt"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// copyOut and copyIn move a caller's buffer. On the host backend the shim's
// C programs pass memory the backend did not allocate (malloc), which its
// checked copies refuse: that memory is plain host memory, copied directly.
func (c *Comm) copyOut(dst []byte, src uintptr) error {
	if c.dev.Info().Kind == device.Host {
		copy(dst, device.HostSlice[byte](src, len(dst)))
		return nil
	}
	return c.dev.CopyOut(dst, src)
}

func (c *Comm) copyIn(dst uintptr, src []byte) error {
	if c.dev.Info().Kind == device.Host {
		copy(device.HostSlice[byte](dst, len(src)), src)
		return nil
	}
	return c.dev.CopyIn(dst, src)
}

// Bootstrap tags of the staged path (channels use tags with high bits set).
const (
	tagP2P   = 0x6e63 // "nc": send/recv, in order per pair
	tagBcast = 0x6e64
)

// chunk keeps each bootstrap message under its cap.
const chunk = bootstrap.MaxMessageSize / 2

// runStaged carries a broadcast, send or receive through host memory over
// the bootstrap: correct, slow, and never captured into a CUDA graph. It is
// what runs when NCCL is unavailable (why). The caller holds c.mu.
func (c *Comm) runStaged(ctx context.Context, x Call, why string) error {
	if c.capturing(x.Stream) {
		return errorf(InvalidUsage, "%s is captured into a CUDA graph but needs NCCL (%s)", x, why)
	}
	n := int(x.Count) * x.Type.Size()
	s, err := c.stream(x.Stream)
	if err == nil {
		err = s.Synchronize() // the copies below are synchronous: order them after the stream's work
	}
	if err != nil {
		return errorf(UnhandledCudaError, "%s: %v", x, err)
	}
	fail := func(err error) error { return errorf(RemoteError, "rank %d: %s without NCCL: %v", c.rank, x, err) }
	switch {
	case x.Kind == Send:
		buf := make([]byte, n)
		if err := c.copyOut(buf, x.Send); err != nil {
			return fail(err)
		}
		if err := c.sendChunks(ctx, x.Root, tagP2P, buf); err != nil {
			return fail(err)
		}
	case x.Kind == Recv:
		if err := c.recvChunks(ctx, x.Root, tagP2P, x.Recv, n); err != nil {
			return fail(err)
		}
	case x.Kind == Broadcast && x.Root == c.rank:
		buf := make([]byte, n)
		if err := c.copyOut(buf, x.Send); err != nil {
			return fail(err)
		}
		for p := 0; p < c.size; p++ {
			if p != c.rank {
				if err := c.sendChunks(ctx, p, tagBcast, buf); err != nil {
					return fail(err)
				}
			}
		}
		if x.Recv != x.Send {
			if err := c.copyIn(x.Recv, buf); err != nil {
				return fail(err)
			}
		}
	case x.Kind == Broadcast:
		if err := c.recvChunks(ctx, x.Root, tagBcast, x.Recv, n); err != nil {
			return fail(err)
		}
	default:
		return errorf(InvalidUsage, "%s needs NCCL, which is unavailable: %s", x, why)
	}
	c.counts[x.Kind][PathStaged].Add(1)
	return nil
}

func (c *Comm) sendChunks(ctx context.Context, peer, tag int, buf []byte) error {
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(buf))
		if err := c.bs.Send(ctx, peer, tag, buf[off:end]); err != nil {
			return err
		}
		if end == len(buf) {
			return nil
		}
	}
}

func (c *Comm) recvChunks(ctx context.Context, peer, tag int, dst uintptr, n int) error {
	for off := 0; ; off += chunk {
		want := min(chunk, n-off)
		msg, err := c.bs.Recv(ctx, peer, tag)
		if err != nil {
			return err
		}
		if len(msg) != want {
			return fmt.Errorf("rank %d sent %d bytes at offset %d, want %d (the ranks' counts differ)", peer, len(msg), off, want)
		}
		if want > 0 {
			if err := c.copyIn(dst+uintptr(off), msg); err != nil {
				return err
			}
		}
		if off+want == n {
			return nil
		}
	}
}
