package buffer

import (
	"fmt"
	"os"
	"time"

	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// Config sizes a Buffer. Every rank of a group passes the same MaxTokens,
// Hidden, TopK, Experts, FP8 and WorkspaceBytes (New checks); Handles,
// Timeout and Tag are per rank but usually equal too.
type Config struct {
	// MaxTokens is the most tokens one rank dispatches in one call.
	MaxTokens int
	// Hidden is the row length in elements: a multiple of 8 (BF16 rows move
	// as 16-byte vectors), of 128 with FP8.
	Hidden int
	// TopK is the number of experts per token (1..32).
	TopK int
	// Experts is the global expert count, a multiple of the rank count;
	// rank r owns experts [r*E/R, (r+1)*E/R).
	Experts int
	// FP8 reserves room for FP8 rows' scales (one float32 per 128
	// elements) in the receive region.
	FP8 bool
	// Handles is the number of handle slots: how many dispatch handles can
	// be alive at once (0 means DefaultHandles).
	Handles int
	// Events is the size of the pool of per-call Done events (0 means
	// DefaultEvents): how many results' Done events an engine may hold
	// unreleased before the oldest is recycled.
	Events int
	// WorkspaceBytes, when not 0, is the size of the NVLink workspace to
	// allocate, like DeepEP's num_nvl_bytes; it must hold every region of
	// the layout SizeHints computes. 0 means exactly the layout's size.
	WorkspaceBytes int
	// Timeout bounds every device-side wait (the communicator's
	// Timeouts.Wait); 0 means $GOEP_CHANNEL_TIMEOUT, else 60 s.
	Timeout time.Duration
	// Dispatch and Combine size the kernels' launches; zero fields take
	// DefaultLaunch(ranks, op), shrunk to this rank's share of a GPU that
	// several ranks share.
	Dispatch, Combine LaunchConfig
	// Tag keeps apart Buffers that are built or closed at the same time
	// over one bootstrap (two micro-batches built from two goroutines):
	// give them different tags, 0..MaxTag. Buffers built one after the
	// other in the same order on every rank may share a tag.
	Tag int
	// VirtualNodes splits the ranks of one host into this many nodes of
	// consecutive ranks (it must divide the ranks), whose traffic to each
	// other goes over the network transport: the Buffer then runs the
	// internode mode on one host. 0 means $GOEP_VIRTUAL_NODES, else none (a
	// node is a host); 1 is one node. Every rank must pass the same.
	VirtualNodes int
}

// DefaultHandles is the number of handle slots when Config.Handles is 0:
// a pipeline of a few layers and two micro-batches keeps its handles alive
// until their combines (a slot is small: SizeHint.HandleSlot).
const DefaultHandles = 16

// MaxHandles and MaxEvents bound Config.Handles and Config.Events.
const (
	MaxHandles = 1 << 16
	MaxEvents  = 1 << 16
)

// MaxTag is the largest Config.Tag.
const MaxTag = 1<<24 - 1

func (c Config) events() int {
	if c.Events == 0 {
		return DefaultEvents
	}
	return c.Events
}

func (c Config) handles() int {
	if c.Handles == 0 {
		return DefaultHandles
	}
	return c.Handles
}

// intranode is the workspace configuration for ranks ranks.
func (c Config) intranode(ranks int) (intranode.Config, error) {
	switch {
	case ranks < 1 || ranks > intranode.MaxRanks:
		return intranode.Config{}, fmt.Errorf("%d ranks: a node-local buffer takes 1..%d", ranks, intranode.MaxRanks)
	case c.Experts < 1 || c.Experts%ranks != 0:
		return intranode.Config{}, fmt.Errorf("%d experts do not divide evenly over %d ranks", c.Experts, ranks)
	case c.MaxTokens < 1 || c.MaxTokens > routing.MaxTokens:
		return intranode.Config{}, fmt.Errorf("max tokens %d: want 1..%d", c.MaxTokens, routing.MaxTokens)
	case c.Handles < 0 || c.Handles > MaxHandles:
		return intranode.Config{}, fmt.Errorf("%d handle slots: want 0..%d", c.Handles, MaxHandles)
	case c.Events < 0 || c.Events > MaxEvents:
		return intranode.Config{}, fmt.Errorf("%d done events: want 0..%d", c.Events, MaxEvents)
	case c.WorkspaceBytes < 0:
		return intranode.Config{}, fmt.Errorf("workspace of %d bytes", c.WorkspaceBytes)
	case c.Timeout < 0:
		return intranode.Config{}, fmt.Errorf("timeout %s", c.Timeout)
	case c.Tag < 0 || c.Tag > MaxTag:
		return intranode.Config{}, fmt.Errorf("tag %d: want 0..%d", c.Tag, MaxTag)
	}
	ic := intranode.Config{Ranks: ranks, MaxTokens: c.MaxTokens, Hidden: c.Hidden, TopK: c.TopK,
		LocalExperts: c.Experts / ranks, FP8: c.FP8}
	return ic, ic.Validate()
}

// SizeHint is what a Buffer of a Config takes on each rank, computed
// without allocating anything.
type SizeHint struct {
	// Layout places the regions of the NVLink workspace.
	Layout intranode.Layout
	// Workspace is the IPC-shared NVLink workspace in bytes (the layout's
	// size, or Config.WorkspaceBytes).
	Workspace int
	// PeerTable holds every rank's workspace address (u64 per rank).
	PeerTable int
	// HandleSlot is one handle's device memory (send positions, prefixes,
	// counts and a copy of the routing); Handles is all slots.
	HandleSlot, Handles int
	// LayoutOutputs are the dispatch-layout kernel's outputs and workspace.
	LayoutOutputs int
	// CombineOutputs is the default combine output: BF16 [MaxTokens][Hidden]
	// and float32 [MaxTokens][TopK].
	CombineOutputs int
	// Barrier is the device barrier's scratch.
	Barrier int
	// IDScratch is int64 [MaxTokens][TopK]: int32 top-k ids widened for
	// the dispatch kernels, which read int64.
	IDScratch int
	// HostMapped is pinned host memory mapped into the device: received
	// count, invalid-id counts and per-local-expert counts.
	HostMapped int
	// Device is the sum of the device allocations above and Internode's.
	// The communicator adds a little more (watchdog, semaphore tokens; see
	// Buffer.Memory).
	Device int
	// NetworkStaging is the pinned host memory the communicator's TCP
	// connections stage through where traffic is staged (GPUs; the host
	// backend stages none): one connection per other node,
	// channels.NetworkConfig.StagingBytes each (56 MiB with the defaults
	// on a host of 16 or more CPUs). Zero in the intranode mode; not in
	// HostMapped.
	NetworkStaging int
	// Internode is what package internode allocates in the internode mode
	// (zero in the intranode mode): the RDMA buffer, the NVLink workspace,
	// the send memory and, where kernels run, their tables (the host
	// backend's Go twins allocate none of Internode.Kernels). Device
	// includes its device memory; HostMapped, the Buffer's own, does not
	// include Internode.HostMapped().
	Internode internode.Memory
	// Nodes and RanksPerNode are the split the Buffer is sized for: one
	// node (intranode) or several (internode).
	Nodes, RanksPerNode int
	// Recv places the internode mode's receive and combine input regions
	// in Workspace (zero in the intranode mode, whose Layout places them).
	Recv RecvLayout
}

// regionAlign keeps the Buffer's own sub-allocations apart on cache lines.
const regionAlign = 256

func alignUp(n int) int { return (n + regionAlign - 1) / regionAlign * regionAlign }

// hostMapped layout: counters first, then the per-local-expert counts.
const (
	mappedRecvCount     = 0  // int32: tokens received (-1 until notify writes it)
	mappedNotifyInvalid = 4  // int32: top-k ids outside [-1, E) seen by the last notify
	mappedLayoutInvalid = 8  // int32: the same, seen by the last layout launch
	mappedExpertCounts  = 64 // int32[LocalExperts]
)

// handleSlot places one handle's device memory.
type handleSlot struct {
	sendPos, rankPrefix, recvBase, numRecv, topk, expertCounts, size int
}

func slotLayout(ic intranode.Config) handleSlot {
	var s handleSlot
	off := 0
	place := func(n int) int {
		o := off
		off += alignUp(n)
		return o
	}
	s.sendPos = place(4 * ic.MaxTokens * ic.Ranks)
	s.rankPrefix = place(4 * ic.Ranks)
	s.recvBase = place(4 * ic.Ranks)
	s.numRecv = place(4)
	s.topk = place(8 * ic.MaxTokens * ic.TopK)
	s.expertCounts = place(4 * ic.LocalExperts)
	s.size = off
	return s
}

// layoutBytes places the layout kernel's outputs: per-rank and per-expert
// counts, is_token_in_rank, then the kernel's workspace.
type layoutPlace struct{ perRank, perExpert, inRank, workspace, size int }

func layoutOutputs(ic intranode.Config) layoutPlace {
	var p layoutPlace
	p.perRank = 0
	p.perExpert = alignUp(4 * ic.Ranks)
	p.inRank = p.perExpert + alignUp(4*ic.Experts())
	p.workspace = p.inRank + alignUp(ic.MaxTokens*ic.Ranks)
	p.size = p.workspace + alignUp(routing.LayoutWorkspaceBytes)
	return p
}

// SizeHints computes what a Buffer of c takes on each of ranks ranks, and
// checks c: experts divisible by ranks, hidden a multiple of what the
// kernels need, the layout fitting Config.WorkspaceBytes. Virtual nodes
// (Config.VirtualNodes or $GOEP_VIRTUAL_NODES) and groups of more ranks
// than one node holds (intranode.MaxRanks) are sized for the internode
// mode; a group spread over hosts is sized again by New once it has
// learnt the hosts.
func SizeHints(c Config, ranks int) (SizeHint, error) {
	topo, err := c.virtualTopology(ranks)
	if err != nil {
		return SizeHint{}, fmt.Errorf("buffer: %w", err)
	}
	if topo.Nodes > 1 || ranks > intranode.MaxRanks {
		if topo.Nodes == 1 { // several hosts, whose split New learns
			topo = internode.Topology{Nodes: ranks, RanksPerNode: 1}
		}
		return internodeSizeHints(c, topo)
	}
	return intranodeSizeHints(c, ranks)
}

// virtualTopology is the split of ranks into virtual nodes that c (or the
// environment) asks for: one node when none.
func (c Config) virtualTopology(ranks int) (internode.Topology, error) {
	switch {
	case c.VirtualNodes < 0:
		return internode.Topology{}, fmt.Errorf("virtual nodes %d: want 0 (from $%s) or a count that divides %d ranks", c.VirtualNodes, internode.VirtualNodesEnv, ranks)
	case c.VirtualNodes > 0:
		t, err := internode.VirtualNodes(ranks, c.VirtualNodes)
		if err != nil {
			return t, fmt.Errorf("Config.VirtualNodes: %w", err)
		}
		return t, nil
	}
	return internode.ParseVirtualNodes(os.Getenv(internode.VirtualNodesEnv), ranks)
}

// intranodeSizeHints sizes the intranode mode.
func intranodeSizeHints(c Config, ranks int) (SizeHint, error) {
	ic, err := c.intranode(ranks)
	if err != nil {
		return SizeHint{}, fmt.Errorf("buffer: %w", err)
	}
	l, err := intranode.NewLayout(ic)
	if err != nil {
		return SizeHint{}, fmt.Errorf("buffer: %w", err)
	}
	h := SizeHint{Layout: l, Workspace: l.Size, PeerTable: 8 * ranks}
	if c.WorkspaceBytes != 0 {
		if c.WorkspaceBytes < l.Size {
			return SizeHint{}, fmt.Errorf("buffer: the regions for %d tokens x hidden %d, top-%d, %d experts, %d ranks%s need a workspace of %d bytes; Config.WorkspaceBytes is %d",
				c.MaxTokens, c.Hidden, c.TopK, c.Experts, ranks, map[bool]string{true: ", FP8", false: ""}[c.FP8], l.Size, c.WorkspaceBytes)
		}
		h.Workspace = c.WorkspaceBytes
	}
	h.HandleSlot = slotLayout(ic).size
	h.Handles = c.handles() * h.HandleSlot
	h.LayoutOutputs = layoutOutputs(ic).size
	h.CombineOutputs = alignUp(2*c.MaxTokens*c.Hidden) + alignUp(4*c.MaxTokens*c.TopK)
	if ranks > 1 {
		h.Barrier = 32 * (ranks - 1)
	}
	h.IDScratch = 8 * c.MaxTokens * c.TopK
	h.HostMapped = mappedExpertCounts + 4*ic.LocalExperts
	h.Device = h.Workspace + h.PeerTable + h.Handles + h.LayoutOutputs + h.CombineOutputs + h.Barrier + h.IDScratch
	h.Nodes, h.RanksPerNode = 1, ranks
	return h, nil
}
