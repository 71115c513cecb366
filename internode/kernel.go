package internode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/checked"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Kernel names in kernels/internode.cu (module "internode"). The host
// backend runs the Go twins (notify.go, dispatch.go, combine.go) instead:
// they are not launched through device.Launch because they work on the
// Notify's Go state, and they stay the protocol's reference.
const (
	KernelNotify   = "goep_internode_notify"
	KernelDispatch = "goep_internode_dispatch"
	KernelCombine  = "goep_internode_combine"
	// KernelCombineReduce is the combine's final reduce on a grid of its
	// own (NotifyConfig.ReduceSMs).
	KernelCombineReduce = "goep_internode_combine_reduce"
)

// Kernels are every kernel package internode launches (to preload).
var Kernels = []string{KernelNotify, KernelDispatch, KernelCombine, KernelCombineReduce}

func init() {
	kernels.Register(kernels.Module{Name: "internode", File: "internode.cu", Kernels: Kernels})
}

// notifyThreads is the notify kernel's block (one block): at least 64
// (N and P threads do per-peer work), small enough that emulated ranks,
// whose threads are OS threads, stay cheap.
const notifyThreads = 128

// runsKernels says whether dev runs goep's CUDA kernels themselves: a GPU,
// or the CPU emulation of the CUDA sources (internal/cpuemu, which loads
// sources as the user-kernel path does). The plain host backend runs the
// Go twins.
func runsKernels(dev device.Device) bool {
	if dev.Info().Kind == device.CUDA {
		return true
	}
	_, emulated := dev.(interface {
		LoadSource(file, src string) ([]string, error)
	})
	return emulated
}

// kernelState is what the kernels need besides the two regions: device
// tables (port channels, peer workspaces, wait ids), the notify output and
// the staged top-k ids, all in one allocation made at setup (nothing is
// allocated per round: ranks sharing a GPU must not allocate while a peer
// spins), and the stream the launches go to.
type kernelState struct {
	buf                 device.Buffer
	ports, peers, waits uintptr
	// out is the dispatch and combine words (outWords; dout); layouts the
	// notify kernel's outputs, one per kept layout (NotifyConfig.Layouts),
	// layoutStride bytes apart (layout).
	out, layouts uintptr
	layoutStride int
	ids          uintptr
	maxIDs       int // top-k ids the ids region holds
	// Dispatch: the layout struct, inputs staged per round (x, scales,
	// weights), the per (token, node) row scratch, dispatch's wait ids.
	dlay, x, scales, weights, scratch, dwaits uintptr
	// Combine: biases staged per round, combine's wait ids (the output
	// reuses x and weights).
	bias0, bias1, cwaits uintptr
	outInts              int
	// epochs is u64 [4] (internode.cu's GOEP_INN_EPOCH_*): the rounds of
	// notify, dispatch and combine and the steps finished, kept on the
	// device so that a graph's replays are new rounds.
	epochs uintptr
	stream device.Stream
	// blocks and threads are the dispatch and combine grid (SetLaunch);
	// split its division into roles (zero counts: every block every role).
	blocks, threads int
	split           Split
	// reduceBlocks is the grid of the combine's final reduce kernel
	// (NotifyConfig.ReduceSMs resolved); 0: the reduce runs inside the
	// combine kernel.
	reduceBlocks int
}

// Launch defaults of the dispatch and combine kernels (NotifyConfig.SMs,
// Threads).
const (
	DefaultSMs             = 16
	DefaultThreads         = 512
	DefaultEmulatedThreads = 64
	maxThreads             = 512 // internode.cu's GOEP_INN_MAX_THREADS (the kernels' launch bound)
)

const (
	// maxBlocks bounds the dispatch and combine grid: internode.cu's
	// GOEP_INN_MAX_UNITS (a unit word per sender block and source node).
	maxBlocks = 1024
	flagUnits = 1 // internode.cu's GOEP_INN_FLAG_UNITS
	// flagCombUnits and flagCombBlocks are internode.cu's
	// GOEP_INN_FLAG_COMB_UNITS and GOEP_INN_FLAG_COMB_BLOCKS
	// (NotifyConfig.ReduceUnits).
	flagCombUnits  = 2
	flagCombBlocks = 4
	// maxCombUnits is internode.cu's GOEP_INN_MAX_CUNITS: a combine unit
	// table's words per node.
	maxCombUnits = 4096
)

// outWords is the dispatch/combine words
// (internode.cu's GOEP_INN_OUT_WORDS: status, bad, four block arrival
// counters, the dispatch's put groups' arrival counters), cleared before
// each launch; groupRangeWords follow them, not cleared (each put group's
// first and end row at every node, written before they are read).
const (
	maxPutGroups    = 64 // internode.cu's GOEP_INN_MAX_GROUPS
	maxNodes        = 64 // internode.cu's GOEP_INN_MAX_NODES
	outWords        = 6 + maxPutGroups
	groupRangeWords = 2 * maxPutGroups * maxNodes
)

// epochWords is the device epochs' u64 words (internode.cu's
// GOEP_INN_EPOCH_*: notify, dispatch, combine, steps).
const epochWords = 4

// resolveLaunch turns a requested grid and split into the one launched:
// sms 0 is DefaultSMs capped by the device's SMs and the spin budget (or
// the split's total where it names counts); a request above the spin
// budget is an error (CheckSpinLaunch's). The split is resolved against
// the grid (Split.resolve).
func (nt *Notify) resolveLaunch(sms, threads int, sp Split) (blocks, thr int, split Split, err error) {
	dev := nt.dev.Info()
	thr = threads
	if thr == 0 {
		thr = DefaultThreads
		if dev.Kind != device.CUDA {
			thr = DefaultEmulatedThreads
		}
	}
	if thr < 32 || thr > maxThreads || thr%32 != 0 {
		return 0, 0, Split{}, fmt.Errorf("%d threads per block: want a multiple of 32 in 32..%d", threads, maxThreads)
	}
	if sms < 0 {
		return 0, 0, Split{}, fmt.Errorf("%d SMs: want >= 0", sms)
	}
	if nt.cfg.DefaultSMs < 0 {
		return 0, 0, Split{}, fmt.Errorf("default grid of %d SMs: want >= 0", nt.cfg.DefaultSMs)
	}
	if err := sp.Validate(); err != nil {
		return 0, 0, Split{}, err
	}
	blocks = sms
	if total := sp.Total(); total > 0 {
		if sms != 0 && sms != total {
			return 0, 0, Split{}, fmt.Errorf("%d SMs and a split %v of %d blocks: pass one, or the same total", sms, sp, total)
		}
		blocks = total
	}
	if blocks == 0 {
		spin := 0
		if pl, err := nt.comm.Placement(context.Background()); err == nil {
			spin = pl.SpinBlocks
		}
		blocks = defaultGrid(nt.cfg.DefaultSMs, dev.SMs, spin)
	}
	if blocks > maxBlocks {
		return 0, 0, Split{}, fmt.Errorf("%d blocks: the dispatch and combine kernels take at most %d", blocks, maxBlocks)
	}
	if err := nt.comm.CheckSpinLaunch("internode dispatch/combine", blocks); err != nil {
		return 0, 0, Split{}, err
	}
	return blocks, thr, sp.resolve(blocks), nil
}

// defaultGrid is the grid when the caller names none: want
// (NotifyConfig.DefaultSMs; DefaultSMs where 0), capped by the device's
// SMs and the spin budget of ranks sharing a GPU (each 0 where unknown).
func defaultGrid(want, devSMs, spin int) int {
	blocks := DefaultSMs
	if want > 0 {
		blocks = want
	}
	if devSMs > 0 {
		blocks = min(blocks, devSMs)
	}
	if spin > 0 {
		blocks = min(blocks, spin)
	}
	return blocks
}

// reduceGrid resolves NotifyConfig.ReduceSMs: -1 is 0 (inside the combine
// kernel), 0 every SM of a GPU (the combine grid in the CPU emulation,
// whose blocks are OS threads).
func (nt *Notify) reduceGrid(combineBlocks int) int {
	switch r := nt.cfg.ReduceSMs; {
	case r < 0:
		return 0
	case r > 0:
		return r
	}
	if dev := nt.dev.Info(); dev.Kind == device.CUDA && dev.SMs > 0 {
		return dev.SMs
	}
	return combineBlocks
}

// SetLaunch sets the grid of later dispatch and combine launches (as
// NotifyConfig.SMs and Threads; 0 picks the default), keeping the
// configured split (a split naming counts fixes the grid: sms must be 0
// or its total): for sweeps. Call it between rounds, never while this
// rank's kernels may still run; other ranks need not pass the same. A
// graph captured earlier keeps the grid it captured.
func (nt *Notify) SetLaunch(sms, threads int) error {
	return nt.setLaunch("SetLaunch", sms, threads, nil)
}

// SetSplit sets the division of later dispatch and combine grids into
// sender, forwarder and receiver blocks (as NotifyConfig.Split: a split
// naming counts sets the grid to their total; the default or Shared keep
// the grid of SetLaunch or NotifyConfig.SMs), with the threads in use: for
// sweeps. The same rules as SetLaunch.
func (nt *Notify) SetSplit(sp Split) error {
	return nt.setLaunch("SetSplit", -1, -1, &sp)
}

// setLaunch resolves sms and threads (-1: keep the configured value) and
// the split (nil: keep the configured one).
func (nt *Notify) setLaunch(op string, sms, threads int, sp *Split) error {
	if nt == nil {
		return errors.New("internode: nil Notify")
	}
	if nt.err != nil {
		return fmt.Errorf("internode: rank %d: %s: %w", nt.rank, op, nt.err)
	}
	if nt.kern == nil {
		return fmt.Errorf("internode: rank %d: %s: kernels do not run on this device (the host backend runs the Go twins)", nt.rank, op)
	}
	cfg := nt.launchCfg
	if sms >= 0 {
		cfg.SMs = sms
	}
	if threads >= 0 {
		cfg.Threads = threads
	}
	if sp != nil {
		cfg.Split = *sp
		if sp.Total() > 0 {
			cfg.SMs = 0
		}
	}
	b, t, split, err := nt.resolveLaunch(cfg.SMs, cfg.Threads, cfg.Split)
	if err != nil {
		return fmt.Errorf("internode: rank %d: %s: %w", nt.rank, op, err)
	}
	nt.launchCfg = cfg
	nt.kern.blocks, nt.kern.threads, nt.kern.split = b, t, split
	nt.kern.reduceBlocks = nt.reduceGrid(b)
	return nil
}

// Launch is the dispatch and combine grid in use (blocks, threads per
// block); zeros where kernels do not run.
func (nt *Notify) Launch() (blocks, threads int) {
	if nt == nil {
		return 0, 0
	}
	if nt.kern == nil {
		return 0, 0
	}
	return nt.kern.blocks, nt.kern.threads
}

// splitFor is the split of a launch of tokens tokens on this rank
// (launchSplit of the configured and resolved splits).
func (nt *Notify) splitFor(tokens int) Split {
	return launchSplit(nt.launchCfg.Split, nt.kern.split, tokens)
}

// LaunchSplit is the division of that grid in use: sender, forwarder and
// receiver blocks, or Shared (every block every role); zero where kernels
// do not run. With no split configured, launches of SharedSplitTokens
// tokens or more on this rank run Shared instead.
func (nt *Notify) LaunchSplit() Split {
	if nt == nil || nt.kern == nil {
		return Split{}
	}
	return nt.kern.split
}

// notifyOutInts is the length of the notify kernel's int32 output
// (internode.cu: status, invalid, per rank, node, expert, from rank,
// relay, relay targets, local experts, rank prefix).
func (s Shape) notifyOutInts() int {
	w, n := s.World(), s.Nodes
	return 2 + w + n + s.Experts + w + n + n*s.RanksPerNode + s.LocalExperts() + w
}

// kernelRegions places the kernels' tables in their one allocation:
// channel handles, peer workspaces, wait ids, outputs, copies of the
// caller's ids, rows, scales, weights and biases for MaxTokens tokens
// (maxIDs = MaxTokens x top-k, overflow-checked by the caller; the larger
// products were checked by newDispatchLayout), the row scratch and the
// phase trace, the dispatch layout structs and the step epochs; layouts
// copies of the notify kernel's output (NotifyConfig.Layouts: a few KB
// each).
type kernelRegions struct {
	ports, peers, waits, out, notifyOut, ids, dlay, x, scales, weights, scratch, dwaits, bias0, bias1, cwaits, epochs int
	notifyStride                                                                                                      int
	size                                                                                                              int
}

func (s Shape) kernelRegions(maxTokens, maxIDs, layouts int) kernelRegions {
	n, p := s.Nodes, s.RanksPerNode
	var o kernelRegions
	take := func(b int) int { at := o.size; o.size += int(align16(int64(b))); return at }
	m, h := maxTokens, s.Hidden
	o.ports = take(n * devapi.PortChannelSize)
	o.peers = take(8 * p)
	o.waits = take(4 * (n + p))
	o.out = take(4 * (outWords + groupRangeWords)) // dispatch's and combine's words
	o.notifyStride = int(align16(int64(4 * s.notifyOutInts())))
	o.notifyOut = take(layouts * o.notifyStride) // the caller bounds layouts (MaxLayouts)
	o.ids = take(8 * maxIDs)
	o.dlay = take(2 * dlayBytes) // the layout for BF16 rows, then for FP8 rows
	o.x = take(m * 2 * h)        // BF16 rows are the larger
	o.scales = take(m * 4 * (h / FP8Block))
	o.weights = take(4 * maxIDs)
	o.scratch = take(tokenMapOffset(m, n) + 4*(n+1)*m) // the row scratch, the phase trace's region, the token map
	o.dwaits = take(4 * (2*n + 3*p))
	o.bias0 = take(m * 2 * h)
	o.bias1 = take(m * 2 * h)
	o.cwaits = take(4 * (p + n))
	o.epochs = take(8 * epochWords)
	return o
}

// setupKernels allocates and fills the kernels' tables, preloads the
// module (CUDA: loading code waits for every kernel in the context, so it
// must happen before any rank can spin), checks the one-block launch
// against the spin budget of ranks sharing a GPU, and meets the other
// ranks once more so that none launches before every rank has preloaded.
func (nt *Notify) setupKernels(ctx context.Context) error {
	s := nt.shape
	if nt.cfg.MaxTokens <= 0 {
		return errors.New("a GPU (or the CPU emulation) needs NotifyConfig.MaxTokens > 0: the top-k ids are staged in device memory sized by it at setup")
	}
	maxIDs, ok := checked.Mul(nt.cfg.MaxTokens, s.TopK)
	if !ok {
		return fmt.Errorf("%d tokens x top-k %d overflow", nt.cfg.MaxTokens, s.TopK)
	}
	ks := &kernelState{maxIDs: maxIDs, outInts: s.notifyOutInts()}
	o := s.kernelRegions(nt.cfg.MaxTokens, maxIDs, nt.cfg.layouts())
	var err error
	if ks.buf, err = nt.alloc(o.size); err != nil {
		return err
	}
	nt.kern = ks
	base := ks.buf.Ptr
	ks.ports, ks.peers, ks.waits, ks.out, ks.ids = base+uintptr(o.ports), base+uintptr(o.peers), base+uintptr(o.waits), base+uintptr(o.out), base+uintptr(o.ids)
	ks.layouts, ks.layoutStride = base+uintptr(o.notifyOut), o.notifyStride
	ks.dlay, ks.x, ks.scales, ks.weights, ks.scratch, ks.dwaits = base+uintptr(o.dlay), base+uintptr(o.x), base+uintptr(o.scales),
		base+uintptr(o.weights), base+uintptr(o.scratch), base+uintptr(o.dwaits)
	ks.bias0, ks.bias1, ks.cwaits = base+uintptr(o.bias0), base+uintptr(o.bias1), base+uintptr(o.cwaits)
	ks.epochs = base + uintptr(o.epochs)
	if err := nt.dev.CopyIn(ks.epochs, make([]byte, 8*epochWords)); err != nil {
		return err
	}
	for _, t := range []struct {
		at  uintptr
		ids []uint32
	}{
		{ks.dwaits, append(append(append(append(append([]uint32(nil), nt.dispNetWait...), nt.readyWait...), nt.dispNVLWait...), nt.doneNetWait...), nt.doneNVLWait...)},
		{ks.cwaits, append(append([]uint32(nil), nt.combReady...), nt.combNetWait...)},
	} {
		b := make([]byte, 4*len(t.ids))
		for j, id := range t.ids {
			binary.LittleEndian.PutUint32(b[4*j:], id)
		}
		if err := nt.dev.CopyIn(t.at, b); err != nil {
			return err
		}
	}
	for j, fp8 := range []bool{false, true} {
		if err := nt.dev.CopyIn(ks.dlay+uintptr(j*dlayBytes), nt.dl.encode(s, fp8, nt.cfg)); err != nil {
			return err
		}
	}
	tab := make([]byte, o.out)
	for j, ch := range nt.port {
		if j != s.Node(nt.rank) {
			ch.Encode(tab[o.ports+j*devapi.PortChannelSize:])
		}
	}
	for l, v := range nt.peerNVL {
		binary.LittleEndian.PutUint64(tab[o.peers+8*l:], uint64(v))
	}
	for j, id := range append(append([]uint32(nil), nt.netWait...), nt.nvlWait...) {
		binary.LittleEndian.PutUint32(tab[o.waits+4*j:], id)
	}
	if err := nt.dev.CopyIn(base, tab); err != nil {
		return err
	}
	if ks.stream, err = nt.dev.NewStream(); err != nil {
		return err
	}
	if nt.dev.Info().Kind == device.CUDA {
		if err := nt.dev.Preload(Kernels...); err != nil {
			return err
		}
	}
	if _, err := nt.comm.Placement(ctx); err != nil {
		return err
	}
	if err := nt.comm.CheckSpinLaunch("internode notify", 1); err != nil {
		return err
	}
	if ks.blocks, ks.threads, ks.split, err = nt.resolveLaunch(nt.cfg.SMs, nt.cfg.Threads, nt.cfg.Split); err != nil {
		return err
	}
	ks.reduceBlocks = nt.reduceGrid(ks.blocks)
	nt.launchCfg = nt.cfg
	return nt.comm.Barrier(ctx)
}

func (ks *kernelState) free(dev device.Device) error {
	var errs []error
	if ks.stream != nil {
		errs = append(errs, ks.stream.Close())
		ks.stream = nil
	}
	if ks.buf.Ptr != 0 {
		errs = append(errs, dev.Free(ks.buf))
		ks.buf = device.Buffer{}
	}
	return errors.Join(errs...)
}

// notifyKernel runs the next notify round with the notify kernel: the twin's steps
// (notify.go) on the same memory. ok is false when a wait gave up (the
// watchdog holds the record); err is a launch or copy failure.
func (nt *Notify) notifyKernel(ids []int64) (_ *NotifyResult, ok bool, err error) {
	s := nt.shape
	ks := nt.kern
	if len(ids) > 0 {
		if err := nt.dev.CopyInAsync(ks.ids, int64Bytes(ids), ks.stream); err != nil {
			return nil, true, err
		}
	}
	if err := nt.launchNotify(ks.stream, ks.ids, len(ids)/s.TopK, nt.cfg.Alignment, DeviceNotify{}); err != nil {
		return nil, true, err
	}
	if err := ks.stream.Synchronize(); err != nil {
		return nil, true, err
	}
	raw := make([]byte, 4*ks.outInts)
	if err := nt.dev.CopyOut(raw, ks.layout(0)); err != nil {
		return nil, true, err
	}
	out := make([]int32, ks.outInts)
	for j := range out {
		out[j] = int32(binary.LittleEndian.Uint32(raw[4*j:]))
	}
	if out[0] != 1 {
		return nil, false, nil
	}
	w, n, p, le := s.World(), s.Nodes, s.RanksPerNode, s.LocalExperts()
	next := func(k int) []int32 { v := append([]int32(nil), out[:k]...); out = out[k:]; return v }
	out = out[1:]
	res := &NotifyResult{Layout: Layout{Tokens: len(ids) / s.TopK}}
	res.Layout.Invalid = int(next(1)[0])
	res.Layout.TokensPerRank = next(w)
	res.Layout.TokensPerNode = next(n)
	res.Layout.TokensPerExpert = next(s.Experts)
	res.FromRank = next(w)
	res.Relay = next(n)
	res.RelayTargets = next(n * p)
	perExpert := next(le)
	_ = next(w) // the device's rank prefix (for the dispatch kernel); the host's below is the result

	// What the twin derives on the host, from the kernel's counts.
	res.ViaForwarder = make([]int32, p)
	res.RankPrefix = make([]int32, w)
	res.NodePrefix = make([]int32, n)
	var total int64
	for r, c := range res.FromRank {
		res.ViaForwarder[s.Local(r)] += c
		total += int64(c)
		res.RankPrefix[r] = int32(total)
		res.NodePrefix[s.Node(r)] = int32(total)
	}
	res.Received = int(total)
	res.RelayPrefix = make([]int32, n)
	var sum int32
	for j, c := range res.Relay {
		sum += c
		res.RelayPrefix[j] = sum
	}
	res.TokensPerLocalExpert = make([]int, le)
	for x, c := range perExpert {
		res.TokensPerLocalExpert[x] = int(c)
	}
	return res, true, nil
}

// launchNotify enqueues the notify kernel for the next round on st (the
// kernel reads its number on the device), with the device-pointer form's
// optional outputs in o (zero: none). Nothing here depends on the round:
// the same launch replayed from a graph runs the next one.
func (nt *Notify) launchNotify(st device.Stream, ids uintptr, tokens, alignment int, o DeviceNotify) error {
	s, ks := nt.shape, nt.kern
	a, i := s.Node(nt.rank), s.Local(nt.rank)
	args := device.NewArgs(23).Ptr(ids).I32Int(tokens).I32Int(s.TopK).I32Int(s.Experts).I32Int(s.Nodes).
		I32Int(s.RanksPerNode).I32Int(a).I32Int(i).Ptr(ks.epochs).I32Int(alignment).Ptr(nt.rdma.Ptr).Ptr(nt.nvl.Ptr).
		Ptr(ks.peers).Ptr(ks.ports).Ptr(nt.comm.Watchdog()).Ptr(ks.waits).Ptr(ks.layout(o.Layout)).
		Ptr(o.NumRecv).Ptr(o.RankPrefix).Ptr(o.ExpertCounts).Ptr(o.HostInvalid).Ptr(o.HostExpertCounts).Ptr(o.HostRecvCount)
	// Clear the status word in stream order (a memset node in a graph): a
	// kernel that gives up leaves it clear.
	if err := nt.dev.MemsetAsync(ks.layout(o.Layout), 0, 4, st); err != nil {
		return err
	}
	return nt.dev.Launch(KernelNotify, device.Dim3{X: 1}, device.Dim3{X: notifyThreads}, 0, st, args)
}

func int64Bytes(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for j, x := range v {
		binary.LittleEndian.PutUint64(b[8*j:], uint64(x))
	}
	return b
}

// dispatchKernel runs the next dispatch round with the dispatch kernel: the
// twin's steps (dispatch.go) on the same memory, with the inputs staged in
// device memory first. ok is false when a wait gave up; bad reports a
// relayed row the kernel skipped because its place lies outside the
// receive region (the twin stops at it); err is a launch or copy failure.
func (nt *Notify) dispatchKernel(in RankInput, tokens int, fp8 bool) (out *RankOutput, ok bool, bad, err error) {
	s, dl, ks, res := nt.shape, nt.dl, nt.kern, nt.last
	n, k, h := s.Nodes, s.TopK, s.Hidden
	i := s.Local(nt.rank)
	le := binary.LittleEndian
	xBytes := 2 * h
	if fp8 {
		xBytes = h + 4*(h/FP8Block)
	}
	nt.dispXBytes = xBytes // combine finds the relay rows' metadata after x

	// Stage the inputs (the ids are notify's, already here; the layout
	// tables were written at setup).
	var xb, scb []byte
	if fp8 {
		xb = append([]byte(nil), in.XFP8...)
		scb = make([]byte, 4*len(in.Scales))
		for j, v := range in.Scales {
			le.PutUint32(scb[4*j:], math.Float32bits(v))
		}
	} else {
		xb = make([]byte, 2*len(in.X))
		for j, v := range in.X {
			le.PutUint16(xb[2*j:], v)
		}
	}
	var wb []byte
	if in.Weights != nil {
		wb = make([]byte, 4*len(in.Weights))
		for j, v := range in.Weights {
			le.PutUint32(wb[4*j:], math.Float32bits(v))
		}
	}
	for _, c := range []struct {
		dst uintptr
		b   []byte
	}{{ks.x, xb}, {ks.scales, scb}, {ks.weights, wb}} {
		if len(c.b) > 0 {
			if err := nt.dev.CopyInAsync(c.dst, c.b, ks.stream); err != nil {
				return nil, true, nil, err
			}
		}
	}
	dd := DeviceDispatch{X: ks.x, FP8: fp8, ScaleStrides: [2]int64{int64(h / FP8Block), 1}}
	if fp8 {
		dd.Scales = ks.scales
	}
	if in.Weights != nil {
		dd.Weights = ks.weights
	}
	if err := nt.launchDispatch(ks.stream, ks.ids, tokens, dd); err != nil {
		return nil, true, nil, err
	}
	done, skipped, err := ks.stepStatus(nt.dev)
	if err != nil {
		return nil, true, nil, err
	}
	if !done {
		return nil, false, nil, nil
	}
	if skipped {
		return nil, true, errors.New("a relayed row's place lies outside the receive region (or more rows were relayed than the relay region holds): the kernel skipped it"), nil
	}

	// Read back what the twin reads in place: the relay rows' metadata
	// (Relayed) and the receive rows.
	out = &RankOutput{}
	for src := 0; src < n; src++ {
		rows := int(res.Relay[src])
		if rows == 0 {
			continue
		}
		b := make([]byte, rows*dl.relayRow)
		if err := nt.dev.CopyOut(b, nt.rdma.Ptr+uintptr(dl.relay+src*dl.maxTokens*dl.relayRow)); err != nil {
			return nil, true, nil, err
		}
		for j := 0; j < rows; j++ {
			o := j*dl.relayRow + xBytes + 12*k
			out.Relayed = append(out.Relayed, Relay{SrcRank: int32(s.Rank(src, i)), SrcToken: int32(le.Uint32(b[o:])),
				Targets: uint8(le.Uint32(b[o+4:]))})
		}
	}
	rows := make([]byte, res.Received*dl.recvRow)
	if err := nt.dev.CopyOut(rows, nt.nvl.Ptr+uintptr(dl.recv)); err != nil {
		return nil, true, nil, err
	}
	nt.readRecv(out, rows, in.Weights != nil, fp8, xBytes)
	return out, true, nil, nil
}

// launchDispatch enqueues the dispatch kernel for the next dispatch round
// on st (its number, and the steps a cached dispatch waits for, are read
// on the device): ids are notify's (tokens rows), the inputs and the
// optional unpacked outputs in a (X zero: route only).
func (nt *Notify) launchDispatch(st device.Stream, ids uintptr, tokens int, a DeviceDispatch) error {
	s, ks := nt.shape, nt.kern
	fp8Arg, cached := 0, 0
	if a.FP8 {
		fp8Arg = 1
	}
	if a.Cached {
		cached = 1
		// A cached route-only dispatch after a BF16 dispatch of the same
		// notify round (nt.dispXBytes is that round's last): every
		// forwarder's relay rows already hold this route in the layout a
		// route-only dispatch writes (the same ids give the same rows and
		// metadata, and only dispatches write relay rows), so the kernel
		// skips its network puts (bit 1) and only counts them.
		if a.RouteOnly && nt.dispXBytes == s.xBytes(false) {
			cached |= 2
		}
		// After Resume the receive bases this rank publishes are another
		// round's than the ones its node peers' combine may still read
		// (bit 2: publish them only once every local rank finished its
		// earlier steps; no notify round orders them).
		if nt.resumed {
			cached |= 4
		}
	}
	// Offsets of notify's outputs that dispatch reads on the device, in
	// the layout of the round being dispatched.
	relayOff, prefixOff := s.notifyOffsets()
	cur := ks.layout(nt.cur)
	node, i := s.Node(nt.rank), s.Local(nt.rank)
	sp := nt.splitFor(tokens)
	args := device.NewArgs(35).Ptr(a.X).Ptr(a.Scales).Ptr(ids).Ptr(a.Weights).I32Int(tokens).I32Int(s.Hidden).I32Int(s.TopK).
		I32Int(s.Experts).I32Int(s.Nodes).I32Int(s.RanksPerNode).I32Int(node).I32Int(i).I32Int(fp8Arg).Ptr(ks.epochs).Ptr(ks.dlayFor(a.FP8)).
		Ptr(cur + uintptr(prefixOff)).Ptr(cur + uintptr(relayOff)).Ptr(ks.scratch).Ptr(nt.rdma.Ptr).Ptr(nt.nvl.Ptr).
		Ptr(ks.peers).Ptr(ks.ports).Ptr(nt.comm.Watchdog()).Ptr(ks.dwaits).Ptr(ks.dout()).
		U64Int(int(a.ScaleStrides[0])).U64Int(int(a.ScaleStrides[1])).
		Ptr(a.RecvX).Ptr(a.RecvScales).Ptr(a.RecvTopK).Ptr(a.RecvWeights).Ptr(a.RecvSrcToken).
		I32Int(cached).I32Int(sp.Senders).I32Int(sp.Forwarders)
	// Clear the status words and the block arrival counters in stream
	// order (a memset node in a graph): a kernel that gives up leaves the
	// status clear, and the next launch counts its blocks from 0.
	if err := nt.dev.MemsetAsync(ks.dout(), 0, 4*outWords, st); err != nil {
		return err
	}
	nt.dispXBytes = s.xBytes(a.FP8) // combine finds the relay rows' metadata after x
	if err := nt.dev.Launch(KernelDispatch, device.Dim3{X: ks.blocks}, device.Dim3{X: ks.threads}, 0, st, args); err != nil {
		return err
	}
	nt.steps++ // the host's count, for diagnostics (the kernels count on the device)
	return nil
}

// dlayBytes is sizeof(goep_inn_dispatch_layout) (internode.cu).
const dlayBytes = 168

// dlayFor is the device copy of the dispatch layout for BF16 or FP8 rows.
func (ks *kernelState) dlayFor(fp8 bool) uintptr {
	if fp8 {
		return ks.dlay + dlayBytes
	}
	return ks.dlay
}

// xBytes is the x part of a relay row: BF16 2H, or FP8 H + 4H/128.
func (s Shape) xBytes(fp8 bool) int {
	if fp8 {
		return s.Hidden + 4*(s.Hidden/FP8Block)
	}
	return 2 * s.Hidden
}

// encode is the goep_inn_dispatch_layout struct (internode.cu) for rows of
// the given format, with the kernels' put size and forwarding
// (NotifyConfig.PutBytes and Forward, checked at setup).
func (dl dispatchLayout) encode(s Shape, fp8 bool, cfg NotifyConfig) []byte {
	le := binary.LittleEndian
	lay := make([]byte, dlayBytes)
	for j, v := range []int{dl.netCounters, dl.relay, dl.send, dl.nvlCounters, dl.ready, dl.bases, dl.recv} {
		le.PutUint64(lay[8*j:], uint64(v))
	}
	for j, v := range []int{dl.relayRow, dl.recvRow, dl.maxTokens, s.xBytes(fp8)} {
		le.PutUint32(lay[56+4*j:], uint32(v))
	}
	for j, v := range []int{dl.combCounters, dl.combRecv, dl.combSend, dl.combReady} {
		le.PutUint64(lay[72+8*j:], uint64(v))
	}
	le.PutUint32(lay[104:], uint32(dl.partialRow))
	le.PutUint32(lay[108:], uint32(cfg.PutBytes))
	le.PutUint64(lay[112:], uint64(dl.doneNet))
	le.PutUint64(lay[120:], uint64(dl.doneNVL))
	le.PutUint64(lay[128:], uint64(dl.sendBase))
	le.PutUint32(lay[136:], dl.sendID)
	var flags, minRows uint32
	switch cfg.Forward {
	case ForwardBlocks:
		flags |= flagUnits
	case ForwardAuto:
		flags |= flagUnits
		if dl.relayRow > 0 {
			minRows = uint32(min((forwardAutoBytes+dl.relayRow-1)/dl.relayRow, math.MaxUint32))
		}
	}
	if cfg.ReduceUnits == ReduceByUnits {
		flags |= flagCombUnits
		if combUnitsPerBlock {
			flags |= flagCombBlocks
		}
	}
	le.PutUint32(lay[140:], flags)
	le.PutUint64(lay[144:], uint64(dl.unitWords))
	le.PutUint32(lay[152:], minRows)
	le.PutUint32(lay[156:], uint32(cfg.PutGroups))
	le.PutUint64(lay[160:], uint64(dl.combUnitWords))
	return lay
}

// notifyOffsets are the byte offsets, in the notify kernel's output, of
// the relay counts and the rank prefix that dispatch and combine read on
// the device.
func (s Shape) notifyOffsets() (relay, prefix int) {
	w, n := s.World(), s.Nodes
	relay = 4 * (2 + w + n + s.Experts + w)
	return relay, relay + 4*(n+n*s.RanksPerNode+s.LocalExperts())
}

// perNodeOffset is the byte offset, in the notify kernel's output, of
// this rank's token counts per node (the rows it sends to each: the
// combine by units waits for that many at each node).
func (s Shape) perNodeOffset() int { return 4 * (2 + s.World()) }

// tokenMapOffset is the offset of the combine's token map from the row
// scratch (internode.cu's goep_inn_token_of): after the phase trace's
// region; i32 [nodes][maxTokens] tokens, then u32 [maxTokens] pending
// counts, zero at setup.
func tokenMapOffset(maxTokens, nodes int) int { return traceOffset(maxTokens, nodes) + TraceBytes }

// combineKernel runs the next combine round with the combine kernel: the twin's
// steps (combine.go) on the same memory, with the expert outputs copied
// into this rank's receive rows and the biases staged first, in stream
// order. ok, bad and err as dispatchKernel's.
func (nt *Notify) combineKernel(in CombineInput, opt CombineOptions, tokens int) (out *CombineOutput, ok bool, bad, err error) {
	dl, ks, res := nt.dl, nt.kern, nt.last
	k, h := nt.shape.TopK, nt.shape.Hidden
	le := binary.LittleEndian
	weights := in.Weights != nil
	if res.Received > 0 {
		img := make([]byte, res.Received*dl.recvRow)
		for r := 0; r < res.Received; r++ {
			row := img[r*dl.recvRow:]
			for j := 0; j < h; j++ {
				le.PutUint16(row[2*j:], in.Y[r*h+j])
			}
			if weights {
				for j := 0; j < k; j++ {
					le.PutUint32(row[2*h+4*j:], math.Float32bits(in.Weights[r*k+j]))
				}
			}
		}
		if err := nt.dev.CopyInAsync(nt.nvl.Ptr+uintptr(dl.recv), img, ks.stream); err != nil {
			return nil, true, nil, err
		}
	}
	var bias [2]uintptr
	for j, b := range [][]uint16{in.Bias0, in.Bias1} {
		if b == nil {
			continue
		}
		bias[j] = []uintptr{ks.bias0, ks.bias1}[j]
		if len(b) > 0 {
			bb := make([]byte, 2*len(b))
			for q, v := range b {
				le.PutUint16(bb[2*q:], v)
			}
			if err := nt.dev.CopyInAsync(bias[j], bb, ks.stream); err != nil {
				return nil, true, nil, err
			}
		}
	}
	// The expert outputs are in the receive rows already (Y zero: the
	// kernel copies nothing); weights says the rows carry weights.
	dc := DeviceCombine{Bias0: bias[0], Bias1: bias[1], Out: ks.x, Partial: opt.Partial}
	if weights {
		dc.OutWeights = ks.weights
	}
	if err := nt.launchCombine(ks.stream, tokens, weights, dc); err != nil {
		return nil, true, nil, err
	}
	done, skipped, err := ks.stepStatus(nt.dev)
	if err != nil {
		return nil, true, nil, err
	}
	if !done {
		return nil, false, nil, nil
	}
	if skipped {
		return nil, true, errors.New("a relayed token's row or partial slot lies outside its region: the kernel skipped it"), nil
	}
	out = &CombineOutput{}
	out.X = make([]uint16, tokens*h)
	xb := make([]byte, 2*tokens*h)
	if err := nt.dev.CopyOut(xb, ks.x); err != nil {
		return nil, true, nil, err
	}
	for j := range out.X {
		out.X[j] = le.Uint16(xb[2*j:])
	}
	if weights {
		out.Weights = make([]float32, tokens*k)
		wb := make([]byte, 4*tokens*k)
		if err := nt.dev.CopyOut(wb, ks.weights); err != nil {
			return nil, true, nil, err
		}
		for j := range out.Weights {
			out.Weights[j] = math.Float32frombits(le.Uint32(wb[4*j:]))
		}
	}
	return out, true, nil, nil
}

// launchCombine enqueues the combine kernel for the next combine round on
// st (its number is read on the device); weights says whether the receive
// rows carry weights (every rank the same); a.Y non-zero makes the kernel
// copy the expert outputs into them first.
func (nt *Notify) launchCombine(st device.Stream, tokens int, weights bool, a DeviceCombine) error {
	s, ks := nt.shape, nt.kern
	b2i := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	relayOff, prefixOff := s.notifyOffsets()
	cur := ks.layout(nt.cur)
	node, i := s.Node(nt.rank), s.Local(nt.rank)
	sp := nt.splitFor(tokens)
	// Shared by the combine kernel and its final reduce: the dispatch
	// layout of the round's rows (FP8 rows when the dispatch was FP8) and
	// the flags.
	dlay := ks.dlayFor(nt.dispXBytes != 2*s.Hidden)
	withWeights, fp32 := b2i(weights), b2i(a.Partial == PartialFP32)
	// The final reduce on a grid of its own after the combine kernel,
	// unless the combine kernel sums each token as its partials land
	// (ReduceUnits).
	apart := ks.reduceBlocks > 0 && nt.cfg.ReduceUnits == ReduceAfter
	args := device.NewArgs(29).I32Int(tokens).I32Int(s.Hidden).I32Int(s.TopK).I32Int(s.Nodes).I32Int(s.RanksPerNode).I32Int(node).I32Int(i).
		I32Int(withWeights).I32Int(fp32).Ptr(ks.epochs).Ptr(dlay).
		Ptr(cur + uintptr(relayOff)).Ptr(ks.scratch).Ptr(a.Bias0).Ptr(a.Bias1).Ptr(a.Out).Ptr(a.OutWeights).
		Ptr(nt.rdma.Ptr).Ptr(nt.nvl.Ptr).Ptr(ks.peers).Ptr(ks.ports).Ptr(nt.comm.Watchdog()).Ptr(ks.cwaits).Ptr(ks.dout()).
		Ptr(a.Y).Ptr(a.Weights).Ptr(cur + uintptr(prefixOff)).I32Int(sp.Senders).I32Int(sp.Forwarders).
		I32Int(b2i(apart)).Ptr(cur + uintptr(s.perNodeOffset()))
	// Clear the status words and the block arrival counters in stream
	// order (a memset node in a graph).
	if err := nt.dev.MemsetAsync(ks.dout(), 0, 4*outWords, st); err != nil {
		return err
	}
	if err := nt.dev.Launch(KernelCombine, device.Dim3{X: ks.blocks}, device.Dim3{X: ks.threads}, 0, st, args); err != nil {
		return err
	}
	if apart {
		// The final reduce on its own grid, in stream order after the
		// combine kernel (it reads the status word that kernel wrote).
		ra := device.NewArgs(15).I32Int(tokens).I32Int(s.Hidden).I32Int(s.TopK).I32Int(s.Nodes).I32Int(node).
			I32Int(withWeights).I32Int(fp32).Ptr(dlay).
			Ptr(ks.scratch).Ptr(a.Bias0).Ptr(a.Bias1).Ptr(a.Out).Ptr(a.OutWeights).Ptr(nt.rdma.Ptr).Ptr(ks.dout())
		if err := nt.dev.Launch(KernelCombineReduce, device.Dim3{X: ks.reduceBlocks}, device.Dim3{X: ks.threads}, 0, st, ra); err != nil {
			return err
		}
	}
	nt.steps++ // the host's count, for diagnostics (the kernels count on the device)
	return nil
}

// dout is the dispatch and combine kernels' words (status, bad, block
// arrival counters: outWords), cleared before each of their launches.
func (ks *kernelState) dout() uintptr { return ks.out }

// layout is kept layout i: the notify kernel's output of the last round
// that wrote it (DeviceNotify.Layout; the slice form always writes 0).
func (ks *kernelState) layout(i int) uintptr { return ks.layouts + uintptr(i*ks.layoutStride) }

// stepStatus waits for the kernels' stream and reads the dispatch/combine
// status words: done says the step finished (else one of its waits gave
// up: the watchdog record names it), skipped that it left out a row whose
// place lay outside its region.
func (ks *kernelState) stepStatus(dev device.Device) (done, skipped bool, err error) {
	if err := ks.stream.Synchronize(); err != nil {
		return false, false, err
	}
	st := make([]byte, 8)
	if err := dev.CopyOut(st, ks.dout()); err != nil {
		return false, false, err
	}
	le := binary.LittleEndian
	return le.Uint32(st) == 1, le.Uint32(st[4:]) != 0, nil
}
