package ep

import (
	"fmt"
	"time"

	"github.com/goep-dev/goep/buffer"
	"github.com/goep-dev/goep/routing"
)

// Config sizes a Buffer and sets its launch parameters. Every rank passes
// the same MaxTokens, Hidden, TopK, Experts, FP8 and WorkspaceBytes
// (NewBuffer checks and names a rank that differs).
type Config struct {
	// MaxTokens is the most tokens one rank dispatches in one call; the
	// receive region holds Ranks*MaxTokens rows (the worst case).
	MaxTokens int
	// Hidden is the row length: a multiple of 8 (of 128 with FP8).
	Hidden int
	// TopK is the number of experts per token, 1..32.
	TopK int
	// Experts is the global expert count: a multiple of the rank count, at
	// most 4096.
	Experts int
	// FP8 makes room for FP8 dispatch (float32 scales per 128 elements).
	FP8 bool
	// Handles is how many dispatch handles may be alive at once (0: 16,
	// at most 65536). A non-cached dispatch takes a free slot and its
	// handle keeps it until Release (or Close); with none free the
	// dispatch is refused (ErrNoHandleSlot). A slot is SizeHint.HandleSlot
	// bytes.
	Handles int
	// Events is the size of the pool of per-call Done events (0: 64, at
	// most 65536): how many results' Done events the engine may hold
	// unreleased before the oldest is recycled (see Event).
	Events int
	// WorkspaceBytes, when not 0, is the NVLink workspace size, like
	// DeepEP's num_nvl_bytes; it must hold every region (SizeHints).
	WorkspaceBytes int
	// Timeout bounds every device-side wait (0: $GOEP_CHANNEL_TIMEOUT,
	// else 60 s). A wait that runs out names the rank it waited on and
	// makes the Buffer refuse calls until Close.
	Timeout time.Duration
	// Tag keeps apart Buffers built or closed at the same time over one
	// bootstrap (0..16777215).
	Tag int
	// Dispatch and Combine size the kernels' launches; zero fields take
	// DefaultLaunch(ranks, op).
	Dispatch, Combine LaunchConfig
	// Layout sizes the dispatch-layout kernel (zero: its defaults).
	Layout routing.LayoutConfig
	// VirtualNodes splits the ranks of one host into this many nodes of
	// consecutive ranks (it must divide the ranks), whose traffic to each
	// other goes over the network transport: the Buffer then runs the
	// internode mode (Buffer.Mode). 0 means $GOEP_VIRTUAL_NODES, else none
	// (a node is a host); 1 is one node. Every rank passes the same. The
	// network transport is TCP unless $GOEP_NET_TRANSPORT=ipc makes it the
	// port over CUDA IPC between virtual nodes (the same port-channel
	// protocol carried by the GPUs' copy engines; channels.NetworkConfig).
	VirtualNodes int
}

// Mode is the protocol a Buffer runs, picked by NewBuffer from the group.
type Mode = buffer.Mode

// Modes.
const (
	// ModeIntranode: every rank on one node.
	ModeIntranode = buffer.Intranode
	// ModeInternode: ranks on several nodes (or virtual nodes).
	ModeInternode = buffer.Internode
)

// LaunchConfig sizes a dispatch or combine launch: SMs (blocks, one per
// SM, capped at the GPU's SM count; 0: the default), Threads per block (a
// multiple of 32 up to the kernel's maximum: dispatch 1024 plain and TMA,
// 512 wide; combine 512; 0: the default for the copy mode) and dispatch's
// Copy path (combine ignores it).
type LaunchConfig = buffer.LaunchConfig

// CopyMode selects how dispatch moves rows.
type CopyMode = buffer.CopyMode

// Copy paths of dispatch.
const (
	CopyDefault = buffer.CopyDefault
	// CopyPlain: 16-byte loads and stores, up to 1024 threads a block.
	CopyPlain = buffer.CopyPlain
	// CopyWide: 16-byte loads and stores with twice the loads in flight,
	// up to 512 threads a block.
	CopyWide = buffer.CopyWide
	// CopyTMA: bulk copies through shared memory (Hopper with NVRTC 12+;
	// elsewhere the same kernel runs the plain body).
	CopyTMA = buffer.CopyTMA
)

// CopyModes lists the copy paths tuning sweeps.
var CopyModes = []CopyMode{CopyPlain, CopyWide, CopyTMA}

// Op names an operation in launch defaults and tuning results.
type Op = buffer.Op

// Operations.
const (
	OpDispatch = buffer.OpDispatch
	OpCombine  = buffer.OpCombine
)

// DefaultLaunch is the launch configuration of op for a group of ranks
// ranks, every field filled in (rank counts without a table entry take the
// 8-rank one).
func DefaultLaunch(ranks int, op Op) LaunchConfig { return buffer.DefaultLaunch(ranks, op) }

func (c Config) buffer() buffer.Config {
	return buffer.Config{MaxTokens: c.MaxTokens, Hidden: c.Hidden, TopK: c.TopK, Experts: c.Experts, FP8: c.FP8,
		Handles: c.Handles, Events: c.Events, WorkspaceBytes: c.WorkspaceBytes, Timeout: c.Timeout, Tag: c.Tag,
		Dispatch: c.Dispatch, Combine: c.Combine, VirtualNodes: c.VirtualNodes}
}

// SizeHint is what a Buffer takes on each rank: the NVLink workspace and
// its regions, handle slots, layout and combine outputs, host-mapped
// counters, and in the internode mode package internode's buffers
// (SizeHint.Internode: RDMA buffer, NVLink workspace, send memory, kernel
// tables).
type SizeHint = buffer.SizeHint

// SizeHints computes what a Buffer of c takes on each of ranks ranks
// without allocating, and checks c (experts divisible by ranks, hidden a
// multiple of what the kernels need, the regions fitting WorkspaceBytes,
// launch parameters).
func SizeHints(c Config, ranks int) (SizeHint, error) {
	h, err := buffer.SizeHints(c.buffer(), ranks)
	if err != nil {
		return h, fmt.Errorf("ep: %w", err)
	}
	if _, err := c.Dispatch.Resolve(ranks, OpDispatch); err != nil {
		return h, fmt.Errorf("ep: %w", err)
	}
	if _, err := c.Combine.Resolve(ranks, OpCombine); err != nil {
		return h, fmt.Errorf("ep: %w", err)
	}
	// Layout's kernel takes up to routing.MaxRanks ranks; a larger
	// (internode) group can still dispatch, and Layout refuses.
	if ranks <= routing.MaxRanks {
		if _, err := routing.PlanLayout(routing.Shape{Tokens: c.MaxTokens, K: c.TopK, Experts: c.Experts, Ranks: ranks}, 0, c.Layout); err != nil {
			return h, fmt.Errorf("ep: %w", err)
		}
	}
	return h, nil
}
