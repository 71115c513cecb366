package buffer

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/checked"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// The internode mode (ranks on several nodes, real or virtual): the Buffer
// runs package internode's notify, dispatch and combine
// (internode/DESIGN.md). On CUDA devices it hands their device-pointer
// form the callers' tensors and its receive region (internode_device.go).
// On the host backend it runs their slice form (the Go twins): it reads its
// callers' device tensors, hands them over and writes the results into its
// own receive region, whose views package ep returns as in the intranode
// mode.
//
// What package internode's slice form does not offer, and how the Buffer
// makes up for it on the host backend (the device path keeps each
// handle's notify layout instead and runs no notify round for these:
// internode_device.go):
//   - a dispatch that reuses an earlier round's layout without a notify
//     round: a cached dispatch runs a notify round again with the handle's
//     routing (the outcome is the same, the counts are exchanged again);
//   - a combine of any dispatch but the last one: Notify.Combine reverses
//     only the latest dispatch, once. A combine of another handle, or a
//     second combine of the same one, first replays that handle's notify
//     and dispatch (with zero rows: combine reads only the route). Every
//     rank makes the same choice, because every rank issues the same calls
//     in the same order and the choice depends only on that order.

// RecvLayout places the internode mode's receive region (rows as package
// ep's dispatch views read them) and combine input in the workspace; each
// region holds Rows rows, Ranks*MaxTokens.
type RecvLayout struct {
	Rows int
	// Byte offsets: X BF16 [Rows][Hidden] (FP8 bytes [Rows][Hidden] after
	// an FP8 dispatch), Scales F32 [Rows][Hidden/128] (FP8 buffers), TopK
	// I64 [Rows][TopK], Weights F32 [Rows][TopK], SrcToken I32 [Rows];
	// CombineX BF16 [Rows][Hidden], CombineWeights F32 [Rows][TopK].
	X, Scales, TopK, Weights, SrcToken, CombineX, CombineWeights int
	Size                                                         int
}

func newRecvLayout(c Config, ranks int) (RecvLayout, error) {
	l := RecvLayout{}
	rows, ok := checked.Mul(ranks, c.MaxTokens)
	if !ok || rows > math.MaxInt32 {
		return l, fmt.Errorf("%d ranks x %d tokens overflow 32-bit row indices", ranks, c.MaxTokens)
	}
	l.Rows = rows
	var err error
	place := func(per int) int {
		n, ok := checked.Mul(rows, per)
		if !ok || n > 1<<50 {
			err = fmt.Errorf("receive region of %d rows x %d bytes: too large", rows, per)
			return 0
		}
		o := l.Size
		l.Size += alignUp(n)
		return o
	}
	l.X = place(2 * c.Hidden)
	if c.FP8 {
		l.Scales = place(4 * (c.Hidden / intranode.FP8Block))
	}
	l.TopK = place(8 * c.TopK)
	l.Weights = place(4 * c.TopK)
	l.SrcToken = place(4)
	l.CombineX = place(2 * c.Hidden)
	l.CombineWeights = place(4 * c.TopK)
	return l, err
}

// internodeSizeHints sizes the internode mode for topology t.
func internodeSizeHints(c Config, t internode.Topology) (SizeHint, error) {
	if err := t.Validate(); err != nil {
		return SizeHint{}, fmt.Errorf("buffer: %w", err)
	}
	ranks := t.World()
	if c.Experts < 1 || c.Experts%ranks != 0 {
		return SizeHint{}, fmt.Errorf("buffer: %d experts do not divide evenly over %d ranks (%v)", c.Experts, ranks, t)
	}
	// Everything the intranode mode refuses, for one node of the group: the
	// NVLink leg reuses the intranode formats and limits.
	node := c
	node.Experts = c.Experts / ranks * t.RanksPerNode
	if _, err := node.intranode(t.RanksPerNode); err != nil {
		return SizeHint{}, fmt.Errorf("buffer: internode (%v): %w", t, err)
	}
	if err := (internode.Shape{Topology: t, Hidden: c.Hidden, TopK: c.TopK, Experts: c.Experts}).Validate(); err != nil {
		return SizeHint{}, fmt.Errorf("buffer: %w", err)
	}
	recv, err := newRecvLayout(c, ranks)
	if err != nil {
		return SizeHint{}, fmt.Errorf("buffer: internode (%v): %w", t, err)
	}
	// Offsets only: the intranode kernels never see this configuration.
	ic := intranode.Config{Ranks: ranks, MaxTokens: c.MaxTokens, Hidden: c.Hidden, TopK: c.TopK, LocalExperts: c.Experts / ranks, FP8: c.FP8}
	h := SizeHint{Workspace: recv.Size, Nodes: t.Nodes, RanksPerNode: t.RanksPerNode, Recv: recv}
	if c.WorkspaceBytes != 0 {
		if c.WorkspaceBytes < recv.Size {
			return SizeHint{}, fmt.Errorf("buffer: the internode receive regions for %d tokens x hidden %d, top-%d, %d ranks need a workspace of %d bytes; Config.WorkspaceBytes is %d",
				c.MaxTokens, c.Hidden, c.TopK, ranks, recv.Size, c.WorkspaceBytes)
		}
		h.Workspace = c.WorkspaceBytes
	}
	h.HandleSlot = slotLayout(ic).size
	if h.Handles, err = mulSize("handle slots", c.handles(), h.HandleSlot); err != nil {
		return SizeHint{}, err
	}
	h.LayoutOutputs = layoutOutputs(ic).size
	h.CombineOutputs = alignUp(2*c.MaxTokens*c.Hidden) + alignUp(4*c.MaxTokens*c.TopK)
	h.IDScratch = 8 * c.MaxTokens * c.TopK
	h.HostMapped = mappedExpertCounts + 4*ic.LocalExperts
	ncfg, err := c.notifyConfig()
	if err != nil {
		return SizeHint{}, fmt.Errorf("buffer: internode (%v): %w", t, err)
	}
	if h.Internode, err = internode.MemoryFor(internode.Shape{Topology: t, Hidden: c.Hidden, TopK: c.TopK, Experts: c.Experts}, ncfg); err != nil {
		return SizeHint{}, fmt.Errorf("buffer: internode (%v): %w", t, err)
	}
	h.Device = h.Workspace + h.Handles + h.LayoutOutputs + h.CombineOutputs + h.IDScratch + h.Internode.Device()
	// The communicator's TCP connections: one to the same local rank of
	// every other node (the port channels of package internode).
	nc, err := channels.NetworkConfig{VirtualNodes: c.VirtualNodes}.Resolve(ranks)
	if err != nil {
		return SizeHint{}, fmt.Errorf("buffer: internode (%v): %w", t, err)
	}
	per, err := nc.StagingBytes()
	if err != nil {
		return SizeHint{}, fmt.Errorf("buffer: internode (%v): %w", t, err)
	}
	if h.NetworkStaging, err = mulSize("TCP staging", t.Nodes-1, per); err != nil {
		return SizeHint{}, err
	}
	return h, nil
}

func mulSize(what string, a, b int) (int, error) {
	n, ok := checked.Mul(a, b)
	if !ok || n > 1<<50 {
		return 0, fmt.Errorf("buffer: %s: %d x %d bytes: too large", what, a, b)
	}
	return n, nil
}

// interState is the internode mode's state on one rank.
type interState struct {
	topo   internode.Topology
	notify *internode.Notify
	// slots[i] is what handle slot i's dispatch learnt on the host.
	slots []interSlot
	// seq numbers non-cached dispatches; last is the seq whose routing the
	// Notify dispatched last, combined whether that round was combined.
	seq, last uint64
	combined  bool
	// device: the calls go to package internode's device-pointer form
	// (CUDA, or the CPU emulation of the kernels: internode_device.go),
	// else to its slice form (the host backend's twins).
	device bool
}

type interSlot struct {
	valid  bool // built by a non-cached dispatch
	seq    uint64
	ids    []int64
	tokens int
	recv   int
}

// topology learns the group's nodes from the communicator (hosts, or the
// virtual nodes it was configured with).
func (b *Buffer) topology(ctx context.Context) (internode.Topology, error) {
	ct, err := b.comm.Topology(ctx)
	if err != nil {
		return internode.Topology{}, b.errorf("%w", err)
	}
	t, err := internode.FromNodeOf(ct.NodeOf)
	if err != nil {
		return internode.Topology{}, b.errorf("nodes of the group: %w", err)
	}
	return t, nil
}

// newInternode sets up the internode mode: package internode's notify
// (with its dispatch and combine regions) and the receive region.
func (b *Buffer) newInternode(ctx context.Context, t internode.Topology) error {
	c := b.cfg
	// CUDA devices run package internode's device-pointer form (the
	// kernels read and write the callers' tensors and the receive region
	// in stream order); the host backend its slice form. Anything else has
	// neither.
	switch k := b.dev.Info().Kind; k {
	case device.Host:
	case device.CUDA:
		// A module load waits for every kernel of the context, and ranks
		// sharing a GPU spin in each other's kernels: load what a call may
		// launch now (NewNotify preloads its own, then meets every rank).
		if err := b.dev.Preload(routing.KernelWidenIDs, routing.KernelLayoutInt64); err != nil {
			return b.errorf("internode mode (%v): %w", t, err)
		}
	default:
		return b.errorf("internode mode (%v): a %s device runs neither the host twins nor the CUDA kernels", t, k)
	}
	shape := internode.Shape{Topology: t, Hidden: c.Hidden, TopK: c.TopK, Experts: c.Experts}
	ncfg, err := c.notifyConfig()
	if err != nil {
		return b.errorf("internode mode (%v): %w", t, err)
	}
	nt, err := internode.NewNotify(ctx, b.comm, shape, ncfg)
	if err != nil {
		return b.errorf("internode mode (%v, %s device): %w", t, b.user.Info().Kind, err)
	}
	b.inter = &interState{topo: t, notify: nt, slots: make([]interSlot, c.handles()), device: nt.DevicePointers()}
	return b.allocate()
}

// NetworkTuning is what the internode mode asks of the network leg.
type NetworkTuning struct {
	// Transport is the network transport between nodes named by
	// $GOEP_NET_TRANSPORT (unset: TCP), which picks the defaults below.
	Transport channels.Transport
	// EmulatedGBps is the line rate $GOEP_NET_EMULATE_GBPS emulates
	// (channels.NetworkConfig.EmulatedGBps; 0: none), which picks the put
	// size too.
	EmulatedGBps float64
	// PutBytes is internode.NotifyConfig.PutBytes: $GOEP_INTERNODE_PUT_BYTES,
	// unset internode.DefaultPutBytesOver the transport and rate (0: one
	// put per node and block).
	PutBytes int
	// PutGroups is internode.NotifyConfig.PutGroups: $GOEP_INTERNODE_PUT_GROUPS,
	// unset internode.DefaultPutGroupsOver the transport.
	PutGroups int
	// Forward is internode.NotifyConfig.Forward: $GOEP_INTERNODE_FORWARD,
	// unset internode.DefaultForwardOver the transport.
	Forward internode.Forward
	// SMs is internode.NotifyConfig.DefaultSMs, the grid where the caller
	// names none: internode.DefaultSMsOver the transport.
	SMs int
	// ReduceUnits is internode.NotifyConfig.ReduceUnits:
	// $GOEP_INTERNODE_REDUCE_UNITS, unset
	// internode.DefaultReduceUnitsOver the transport and rate.
	ReduceUnits internode.ReduceUnits
}

// NetworkTuningFromEnv is the network tuning every Buffer in internode
// mode uses, read from the environment as its communicator reads the
// transport: the one place these defaults are decided (ep-bench reports
// it). An error names the variable it could not parse.
func NetworkTuningFromEnv() (NetworkTuning, error) {
	nw := NetworkTuning{Transport: channels.TransportEthernet}
	if s := os.Getenv(channels.NetTransportEnv); strings.TrimSpace(s) != "" {
		t, err := channels.ParseTransport(s)
		if err != nil {
			return NetworkTuning{}, fmt.Errorf("$%s: %w", channels.NetTransportEnv, err)
		}
		nw.Transport = t
	}
	rate, err := channels.EmulatedGBpsFromEnv()
	if err != nil {
		return NetworkTuning{}, err
	}
	nw.EmulatedGBps = rate
	nw.PutBytes = internode.DefaultPutBytesOver(nw.Transport, rate)
	if s := os.Getenv(internode.PutBytesEnv); strings.TrimSpace(s) != "" {
		v, err := internode.ParsePutBytes(s)
		if err != nil {
			return NetworkTuning{}, fmt.Errorf("$%s: %w", internode.PutBytesEnv, err)
		}
		nw.PutBytes = v
	}
	g, err := internode.ParsePutGroups(os.Getenv(internode.PutGroupsEnv), internode.DefaultPutGroupsOver(nw.Transport))
	if err != nil {
		return NetworkTuning{}, fmt.Errorf("$%s: %w", internode.PutGroupsEnv, err)
	}
	nw.PutGroups = g
	f, err := internode.ParseForward(os.Getenv(internode.ForwardEnv), internode.DefaultForwardOver(nw.Transport))
	if err != nil {
		return NetworkTuning{}, fmt.Errorf("$%s: %w", internode.ForwardEnv, err)
	}
	nw.Forward = f
	nw.SMs = internode.DefaultSMsOver(nw.Transport)
	u, err := internode.ParseReduceUnits(os.Getenv(internode.ReduceUnitsEnv), internode.DefaultReduceUnitsOver(nw.Transport, rate))
	if err != nil {
		return NetworkTuning{}, fmt.Errorf("$%s: %w", internode.ReduceUnitsEnv, err)
	}
	nw.ReduceUnits = u
	return nw, nil
}

// notifyConfig is package internode's configuration of the Buffer's
// internode mode: the caller's Dispatch SMs and threads (0: internode's
// defaults, within the spin budget of ranks sharing a GPU) for the one
// grid of the dispatch and combine kernels, and from the environment,
// read here only: $GOEP_INTERNODE_SPLIT (the grid's roles; unset: the
// default split of the grid), $GOEP_INTERNODE_PUT_BYTES (unset:
// internode.DefaultPutBytesOver the network transport; 0: one put per
// node and block), $GOEP_INTERNODE_FORWARD (unset:
// internode.DefaultForwardOver the network transport),
// $GOEP_INTERNODE_PROXY_PENDING (unset: channels' default),
// $GOEP_INTERNODE_REDUCE_SMS (unset: the combine's final reduce on every
// SM, after its kernel), $GOEP_INTERNODE_REDUCE_UNITS (unset:
// internode.DefaultReduceUnitsOver the transport and rate) and $GOEP_INTERNODE_SEND_MEMORY (unset: device
// memory). SizeHints sizes what NewNotify allocates from the same.
func (c Config) notifyConfig() (internode.NotifyConfig, error) {
	split, err := internode.ParseSplit(os.Getenv(internode.SplitEnv))
	if err != nil {
		return internode.NotifyConfig{}, fmt.Errorf("$%s: %w", internode.SplitEnv, err)
	}
	nw, err := NetworkTuningFromEnv()
	if err != nil {
		return internode.NotifyConfig{}, err
	}
	pending, err := internode.ParseProxyPending(os.Getenv(internode.ProxyPendingEnv))
	if err != nil {
		return internode.NotifyConfig{}, fmt.Errorf("$%s: %w", internode.ProxyPendingEnv, err)
	}
	reduceSMs, err := internode.ParseReduceSMs(os.Getenv(internode.ReduceSMsEnv))
	if err != nil {
		return internode.NotifyConfig{}, fmt.Errorf("$%s: %w", internode.ReduceSMsEnv, err)
	}
	sendMem, err := internode.ParseSendMemory(os.Getenv(internode.SendMemoryEnv))
	if err != nil {
		return internode.NotifyConfig{}, fmt.Errorf("$%s: %w", internode.SendMemoryEnv, err)
	}
	return internode.NotifyConfig{MaxTokens: c.MaxTokens, SMs: c.Dispatch.SMs, DefaultSMs: nw.SMs,
		Threads: c.Dispatch.Threads, Split: split,
		PutBytes: nw.PutBytes, PutGroups: nw.PutGroups, Forward: nw.Forward, ProxyMaxPending: pending, ReduceSMs: reduceSMs, ReduceUnits: nw.ReduceUnits, SendMemory: sendMem,
		// One kept layout per handle slot: a cached dispatch or combine of
		// any live handle resumes its round (internode_device.go).
		Layouts: c.handles()}, nil
}

// readDev copies n bytes at p (a caller's tensor) to the host.
func (b *Buffer) readDev(p uintptr, n int) ([]byte, error) {
	out := make([]byte, n)
	if n == 0 {
		return out, nil
	}
	return out, b.dev.CopyOut(out, p)
}

func (b *Buffer) readU16(p uintptr, n int) ([]uint16, error) {
	if littleEndian {
		out := make([]uint16, n)
		if n == 0 {
			return out, nil
		}
		return out, b.dev.CopyOut(u16Bytes(out), p)
	}
	raw, err := b.readDev(p, 2*n)
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(raw[2*i:])
	}
	return out, err
}

func (b *Buffer) readF32(p uintptr, n int) ([]float32, error) {
	if littleEndian {
		out := make([]float32, n)
		if n == 0 {
			return out, nil
		}
		return out, b.dev.CopyOut(f32Bytes(out), p)
	}
	raw, err := b.readDev(p, 4*n)
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out, err
}

func (b *Buffer) readIDs(p uintptr, n int, i32 bool) ([]int64, error) {
	out := make([]int64, n)
	if i32 {
		raw, err := b.readDev(p, 4*n)
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(raw[4*i:])))
		}
		return out, err
	}
	raw, err := b.readDev(p, 8*n)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
	}
	return out, err
}

// readScales gathers FP8 scales [tokens][hidden/128] at element strides st.
func (b *Buffer) readScales(p uintptr, tokens int, st [2]int64) ([]float32, error) {
	cols := b.cfg.Hidden / intranode.FP8Block
	out := make([]float32, tokens*cols)
	if tokens == 0 {
		return out, nil
	}
	if st == ([2]int64{}) {
		st = [2]int64{int64(cols), 1}
	}
	// The span from the first to the last element, which package ep
	// checked lies inside the caller's tensor.
	span := (int64(tokens-1)*st[0] + int64(cols-1)*st[1] + 1)
	all, err := b.readF32(p, int(span))
	if err != nil {
		return nil, err
	}
	for t := 0; t < tokens; t++ {
		for j := 0; j < cols; j++ {
			out[t*cols+j] = all[int64(t)*st[0]+int64(j)*st[1]]
		}
	}
	return out, nil
}

func putU16s(v []uint16) []byte {
	if littleEndian && len(v) > 0 {
		// A view, not a copy: callers only copy it to the device.
		return u16Bytes(v)
	}
	out := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(out[2*i:], x)
	}
	return out
}

func putF32s(v []float32) []byte {
	if littleEndian && len(v) > 0 {
		return f32Bytes(v) // a view, as putU16s
	}
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func putI32s[T int | int32](v []T) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], uint32(int32(x)))
	}
	return out
}

func putI64s(v []int64) []byte {
	out := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(out[8*i:], uint64(x))
	}
	return out
}

// recvPtr is the address of a region of the internode receive layout.
func (b *Buffer) recvPtr(off int) uintptr { return b.ws.Ptr + uintptr(off) }

// dispatchInternode is Dispatch in the internode mode: one notify round
// and package internode's dispatch, on the host (the stream's earlier work
// is waited for first), the rows written into the receive region.
func (b *Buffer) dispatchInternode(ctx context.Context, c DispatchCall) (DispatchOutcome, error) {
	const op = "internode dispatch"
	out := DispatchOutcome{NumRecv: -1}
	in := b.inter
	if in.device {
		return b.dispatchInternodeDevice(ctx, c)
	}
	cfg := b.cfg
	h, k := cfg.Hidden, cfg.TopK
	if err := c.Stream.Synchronize(); err != nil {
		return out, b.Fail(b.errorf("%s: stream: %w", op, err))
	}
	st := &in.slots[c.Slot]
	// Read every input before the collective starts: a failed read leaves
	// no peer waiting.
	var ids []int64
	var err error
	if c.Cached {
		if !st.valid || st.tokens != c.Tokens {
			return out, b.errorf("%s: handle slot %d holds a routing of %d tokens, the call has %d", op, c.Slot, st.tokens, c.Tokens)
		}
		ids = st.ids
	} else if ids, err = b.readIDs(c.TopK, c.Tokens*k, c.TopKI32); err != nil {
		return out, b.errorf("%s: top-k ids: %w", op, err)
	}
	rin := internode.RankInput{TopK: ids}
	if c.FP8 {
		if rin.XFP8, err = b.readDev(c.X, c.Tokens*h); err == nil {
			rin.Scales, err = b.readScales(c.Scales, c.Tokens, c.ScaleStrides)
		}
	} else {
		rin.X, err = b.readU16(c.X, c.Tokens*h)
	}
	if err == nil && c.Weights != 0 {
		rin.Weights, err = b.readF32(c.Weights, c.Tokens*k)
	}
	if err != nil {
		return out, b.errorf("%s: reading the inputs: %w", op, err)
	}

	// The collective: a notify round, then the rows.
	res, err := in.notify.Run(ids)
	if err != nil {
		return out, b.Fail(b.errorf("%s: %w", op, err))
	}
	got, err := in.notify.Dispatch(rin)
	if err != nil {
		return out, b.Fail(b.errorf("%s: %w", op, err))
	}
	if !c.Cached {
		in.seq++
		*st = interSlot{valid: true, seq: in.seq, ids: append([]int64(nil), ids...), tokens: c.Tokens, recv: res.Received}
	}
	in.last, in.combined = st.seq, false

	// Outputs into the receive region and the slot.
	n, l := res.Received, b.hint.Recv
	perExpert := append([]int(nil), got.TokensPerLocalExpert...)
	if al := c.ExpertAlignment; al > 1 {
		for i, v := range perExpert {
			perExpert[i] = (v + al - 1) / al * al
		}
	}
	topk := got.RecvTopK
	if c.WorstCase {
		// Rows past the received count read as "no expert".
		topk = make([]int64, l.Rows*k)
		for i := range topk {
			topk[i] = -1
		}
		copy(topk, got.RecvTopK)
	}
	writes := []devWrite{
		{"top-k ids", b.recvPtr(l.TopK), putI64s(topk)},
		{"source tokens", b.recvPtr(l.SrcToken), putI32s(got.RecvSrcToken)},
		{"received count", b.slot(c.Slot, c.Tokens).handle.NumRecv, putI32s([]int{n})},
		{"rank prefix", b.slot(c.Slot, c.Tokens).handle.RankPrefix, putI32s(got.RankPrefix)},
	}
	if c.FP8 {
		writes = append(writes, devWrite{"fp8 rows", b.recvPtr(l.X), got.RecvXFP8}, devWrite{"scales", b.recvPtr(l.Scales), putF32s(got.RecvScales)})
	} else {
		writes = append(writes, devWrite{"rows", b.recvPtr(l.X), putU16s(got.RecvX)})
	}
	if c.Weights != 0 {
		writes = append(writes, devWrite{"weights", b.recvPtr(l.Weights), putF32s(got.RecvWeights)})
	}
	if !c.Cached {
		writes = append(writes, devWrite{"expert counts", b.slot(c.Slot, c.Tokens).expertCounts, putI32s(perExpert)})
	}
	for _, w := range writes {
		if len(w.data) == 0 {
			continue
		}
		if err := b.dev.CopyIn(w.p, w.data); err != nil {
			return out, b.Fail(b.errorf("%s: writing the %s: %w", op, w.what, err))
		}
	}
	b.storeMapped(mappedNotifyInvalid, int32(res.Layout.Invalid))
	if c.Cached || !c.HostWait {
		return out, nil
	}
	b.storeMapped(mappedRecvCount, int32(n))
	for i, v := range perExpert {
		b.storeMapped(mappedExpertCounts+4*i, int32(v))
	}
	out.NumRecv, out.TokensPerExpert, out.InvalidIDs = n, perExpert, res.Layout.Invalid
	return out, nil
}

// combineInternode is Combine in the internode mode: package internode's
// combine of the handle's dispatch (replayed first when the Notify's last
// dispatch is another one, or was combined already).
func (b *Buffer) combineInternode(c CombineCall) error {
	const op = "internode combine"
	in := b.inter
	if in.device {
		return b.combineInternodeDevice(c)
	}
	cfg := b.cfg
	h, k := cfg.Hidden, cfg.TopK
	if err := c.Stream.Synchronize(); err != nil {
		return b.Fail(b.errorf("%s: stream: %w", op, err))
	}
	st := in.slots[c.Slot]
	if !st.valid || st.tokens != c.Tokens {
		return b.errorf("%s: handle slot %d holds a routing of %d tokens, the call has %d", op, c.Slot, st.tokens, c.Tokens)
	}
	n := st.recv
	var ci internode.CombineInput
	var err error
	if n > 0 {
		ci.Y, err = b.readU16(c.X, n*h)
	} else {
		ci.Y = []uint16{}
	}
	if err == nil && c.Weights != 0 {
		ci.Weights, err = b.readF32(c.Weights, n*k) // non-nil when empty: the peers pass weights too
	}
	if err == nil && c.Bias0 != 0 {
		ci.Bias0, err = b.readU16(c.Bias0, st.tokens*h)
	}
	if err == nil && c.Bias1 != 0 {
		ci.Bias1, err = b.readU16(c.Bias1, st.tokens*h)
	}
	if err != nil {
		return b.errorf("%s: reading the inputs: %w", op, err)
	}
	if in.last != st.seq || in.combined {
		if _, err := in.notify.Run(st.ids); err != nil {
			return b.Fail(b.errorf("%s: replaying the handle's notify: %w", op, err))
		}
		if _, err := in.notify.Dispatch(internode.RankInput{X: make([]uint16, st.tokens*h), TopK: st.ids}); err != nil {
			return b.Fail(b.errorf("%s: replaying the handle's dispatch: %w", op, err))
		}
		in.last = st.seq
	}
	in.combined = true
	got, err := in.notify.Combine(ci, internode.CombineOptions{Partial: internode.PartialBF16})
	if err != nil {
		return b.Fail(b.errorf("%s: %w", op, err))
	}
	if len(got.X) > 0 {
		if err := b.dev.CopyIn(c.Out, putU16s(got.X)); err != nil {
			return b.Fail(b.errorf("%s: writing the combined rows: %w", op, err))
		}
	}
	if c.OutWeights != 0 && len(got.Weights) > 0 {
		if err := b.dev.CopyIn(c.OutWeights, putF32s(got.Weights)); err != nil {
			return b.Fail(b.errorf("%s: writing the combined weights: %w", op, err))
		}
	}
	return nil
}

// barrierInternode is Barrier in the internode mode: the host backend's
// streams run work as it is issued, so once s has drained, a meeting of
// every rank over the bootstrap orders everything after it.
func (b *Buffer) barrierInternode(s device.Stream) error {
	if err := s.Synchronize(); err != nil {
		return b.Fail(b.errorf("barrier: stream: %w", err))
	}
	if _, err := b.exchangeAll(context.Background(), tagBarrier, nil); err != nil {
		return b.Fail(b.errorf("barrier: meeting the peers: %w", timeoutError(err)))
	}
	return nil
}

// closeInternode closes the Notify (its proxy drains what it sent, the
// ranks meet, then it frees); the caller meets the peers after, as its
// Close requires, before the communicators close.
func (b *Buffer) closeInternode() error {
	if b.inter == nil || b.inter.notify == nil {
		return nil
	}
	err := b.inter.notify.Close()
	b.inter.notify = nil
	if err != nil {
		return b.errorf("close: %w", err) // the Notify names itself ("internode: rank N: ...")
	}
	return nil
}

// devWrite is one host-to-device copy of a call's outputs.
type devWrite struct {
	what string
	p    uintptr
	data []byte
}

// InternodeTrace reads this rank's internode phase-trace region
// (internode.TraceBytes; internode.ParseKernelTrace decodes it): per-block
// stamps of the last dispatch and combine kernels, written only by kernels
// built with GOEP_INN_TRACE=1 (zero otherwise). Synchronous: the caller
// synchronises the calls' stream first. An error in the intranode mode and
// on the host backend (no kernels run there).
func (b *Buffer) InternodeTrace() ([]byte, error) {
	if b == nil {
		return nil, errNil
	}
	// As a call: Close cannot free the Notify meanwhile.
	b.calls.RLock()
	defer b.calls.RUnlock()
	if err := b.Check(); err != nil {
		return nil, err
	}
	if b.inter == nil || b.inter.notify == nil {
		return nil, b.errorf("internode trace: the Buffer does not run the internode mode")
	}
	raw, err := b.inter.notify.KernelTrace()
	if err != nil {
		return nil, b.errorf("%w", err)
	}
	return raw, nil
}
