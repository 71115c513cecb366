package internode

import (
	"fmt"

	"github.com/goep-dev/goep/internal/device"
)

// The device-pointer form of notify, dispatch and combine (where the
// kernels run: a GPU, or the CPU emulation). The caller passes device
// pointers and a stream; the kernels read the inputs and write the
// outputs in place, nothing is copied through the host and no host
// meeting separates the steps: on each rank the three launches are
// ordered by its stream, and between ranks by the kernels' own counters
// (the same protocol and memory as the slice form's, kernel.go). The host
// learns the received count only when it asks for it in host-mapped
// memory (DeviceNotify.HostRecvCount), as intranode's notify does.
//
// A launch failure makes the Notify refuse further calls. A wait that
// gives up is not seen by these calls (they return once enqueued): it is
// in the communicator's watchdog record (Communicator.Check), as for
// every asynchronous channels kernel, and the status words the slice form
// reads stay clear. A round's order: RunAsync, then DispatchAsync, then
// at most one CombineAsync, on one stream or streams the caller orders.
// Every rank makes the same calls with the same formats (BF16 or FP8,
// weights or none, partial format), as for the slice form.

// DeviceNotify is the device-pointer form's notify round. Pointers are
// device addresses (the host-mapped ones: their device side); every
// output is optional (0: not written).
type DeviceNotify struct {
	// TopK is int64 [Tokens][TopK], read by the notify kernel and again by
	// the round's DispatchAsync (and a route-only replay): it must hold the
	// same ids until that dispatch has run.
	TopK   uintptr
	Tokens int
	// ExpertAlignment rounds the per-local-expert counts up (<= 1: none).
	ExpertAlignment int
	// Device outputs, int32: received count [1], rank prefix [World]
	// (rows from sources 0..s), received top-k entries per local expert
	// [LocalExperts] (aligned).
	NumRecv, RankPrefix, ExpertCounts uintptr
	// Host-mapped outputs, int32: this rank's invalid ids [1], per local
	// expert counts [LocalExperts], and the received count [1], written
	// last (after a system fence), for the host to poll.
	HostInvalid, HostExpertCounts, HostRecvCount uintptr
	// Layout is the kept layout (0..NotifyConfig.Layouts-1) the round
	// writes its layout into, replacing the round kept there; Resume makes
	// it current again later.
	Layout int
}

// DeviceDispatch is the device-pointer form's dispatch of the last
// notify round's tokens.
type DeviceDispatch struct {
	// X is BF16 [T][Hidden], or FP8 E4M3 bytes [T][Hidden] with Scales
	// float32 at element strides ScaleStrides {token, column} (zero:
	// row-major). X may be 0 when the round has no tokens here.
	X, Scales    uintptr
	FP8          bool
	ScaleStrides [2]int64
	// RouteOnly dispatches the route only: the relay rows' metadata and the
	// slots that combine reads, no payload (X, Weights and the Recv
	// outputs zero, BF16). A combine of an earlier dispatch first makes
	// its round current again (Resume) and replays a cached route-only
	// dispatch.
	RouteOnly bool
	// Cached dispatches the current notify round's tokens again without a
	// notify round before it (the layout is that round's, so the ids in
	// DeviceNotify.TopK must be the same): DeepEP's cached mode. The
	// current round is the last RunAsync's, or the kept one Resume made
	// current. Allowed after that round's dispatch (or after another
	// cached one, or a combine), and required right after Resume; the kernel waits, instead of the notify round, until each
	// rank whose relay or receive rows it writes has finished its earlier
	// dispatch and combine kernels. It may carry other rows, weights,
	// format or RouteOnly than the earlier dispatches.
	Cached bool
	// Weights is float32 [T][TopK], optional (every rank the same).
	Weights uintptr
	// Receive outputs, [World*MaxTokens] rows of which the first N (the
	// received count) are written, in ReferenceDispatch's order: x (BF16
	// [Hidden] or FP8 bytes [Hidden]), FP8 scales float32 [Hidden/128],
	// local top-k ids int64 [TopK] (-1 for other ranks' experts), weights
	// float32 [TopK] (optional), source token int32. RecvX zero writes
	// none of them.
	RecvX, RecvScales, RecvTopK, RecvWeights, RecvSrcToken uintptr
}

// DeviceCombine is the device-pointer form's combine of the last
// dispatch.
type DeviceCombine struct {
	// Y is BF16 [N][Hidden] and Weights float32 [N][TopK] (optional, every
	// rank the same), N the received count, in dispatch's receive order;
	// Y may be 0 only when nothing was received (N = 0).
	Y, Weights uintptr
	// Bias0, Bias1 are BF16 [T][Hidden], optional.
	Bias0, Bias1 uintptr
	// Out is BF16 [T][Hidden]; OutWeights float32 [T][TopK] (with Weights).
	Out, OutWeights uintptr
	Partial         Partial
}

// asyncReady checks what every device-pointer call needs.
func (nt *Notify) asyncReady(st device.Stream) error {
	if err := nt.devicePointersReady(); err != nil {
		return err
	}
	if st == nil {
		return fmt.Errorf("internode: rank %d: nil stream", nt.rank)
	}
	return nil
}

// devicePointersReady: the Notify has not failed and kernels run here.
func (nt *Notify) devicePointersReady() error {
	if nt.err != nil {
		return nt.err
	}
	if nt.kern == nil {
		return fmt.Errorf("internode: rank %d: the device-pointer form needs a device that runs the kernels (a GPU or the CPU emulation); the host backend takes the slice form", nt.rank)
	}
	return nil
}

func aligned4(ps ...uintptr) bool {
	for _, p := range ps {
		if p%4 != 0 {
			return false
		}
	}
	return true
}

// RunAsync enqueues one notify round on st: collective over every rank.
func (nt *Notify) RunAsync(st device.Stream, a DeviceNotify) error {
	if nt == nil {
		return fmt.Errorf("internode: notify: nil")
	}
	if err := nt.asyncReady(st); err != nil {
		return err
	}
	round := nt.round + 1
	fail := func(format string, args ...any) error {
		return nt.withPeerNode(fmt.Errorf("internode: rank %d: notify round %d: "+format, append([]any{nt.rank, round}, args...)...))
	}
	if a.Tokens < 0 || a.Tokens > nt.cfg.MaxTokens {
		return fail("%d tokens: want 0..NotifyConfig.MaxTokens = %d", a.Tokens, nt.cfg.MaxTokens)
	}
	if a.Tokens > 0 && a.TopK == 0 {
		return fail("no top-k ids for %d tokens", a.Tokens)
	}
	if a.ExpertAlignment < 0 || a.ExpertAlignment > MaxTokens {
		return fail("expert alignment %d: want 0..%d", a.ExpertAlignment, MaxTokens)
	}
	if a.TopK%8 != 0 {
		return fail("top-k ids at %#x: want 8-byte aligned", a.TopK)
	}
	if a.Layout < 0 || a.Layout >= len(nt.kept) {
		return fail("layout %d: want 0..%d (NotifyConfig.Layouts)", a.Layout, len(nt.kept)-1)
	}
	if !aligned4(a.NumRecv, a.RankPrefix, a.ExpertCounts, a.HostInvalid, a.HostExpertCounts, a.HostRecvCount) {
		return fail("an int32 output is not 4-byte aligned")
	}
	if err := nt.comm.Check(); err != nil {
		nt.err = fail("%w", err)
		return nt.err
	}
	nt.round++
	if err := nt.launchNotify(st, a.TopK, a.Tokens, a.ExpertAlignment, a); err != nil {
		nt.err = fail("%w", err)
		return nt.err
	}
	// The slice form's Dispatch and Combine need a host result: refused
	// until the next Run.
	nt.last, nt.lastIDs = nil, nt.lastIDs[:0]
	nt.dev0 = devRound{ids: a.TopK, tokens: a.Tokens, ok: true}
	nt.cur, nt.kept[a.Layout], nt.resumed = a.Layout, nt.dev0, false
	nt.dispatched, nt.combined = false, false
	return nil
}

// devRound is a device-pointer notify round's ids.
type devRound struct {
	ids    uintptr
	tokens int
	ok     bool // a RunAsync round (dev0: the current round is one)
	// dispatched: a dispatch of this round ran (kept layouts: Resume
	// needs one).
	dispatched bool
}

// Resume makes kept layout i's round the current one again, so that the
// next call is a cached DispatchAsync of its tokens (the ids its RunAsync
// was given, which must still hold them) with no notify round, and a
// CombineAsync may follow that dispatch: what a later round replaced was
// only which layout the kernels read, and every kept layout stays in
// device memory until a round writes it again. It enqueues nothing. Like
// every call it is collective: each rank resumes the same round (the
// kernels would otherwise wait for rows that never come, until the
// watchdog). The round must have been dispatched once. The dispatch that
// follows publishes this round's receive bases only once every local rank
// finished its earlier steps (the kernel's cached bit 2): a node peer's
// combine of the earlier round reads the bases it replaces
// (internode/DESIGN.md, "Session 17"; run on GPUs in session 18).
func (nt *Notify) Resume(i int) error {
	if nt == nil {
		return fmt.Errorf("internode: resume: nil notify")
	}
	if err := nt.devicePointersReady(); err != nil {
		return err
	}
	if i < 0 || i >= len(nt.kept) {
		return fmt.Errorf("internode: rank %d: resume layout %d: want 0..%d (NotifyConfig.Layouts)", nt.rank, i, len(nt.kept)-1)
	}
	k := nt.kept[i]
	if !k.ok || !k.dispatched {
		return fmt.Errorf("internode: rank %d: resume layout %d: it holds no dispatched device-pointer round", nt.rank, i)
	}
	// The relay rows in place are another round's: dispXBytes 0 keeps a
	// route-only dispatch from skipping its puts.
	nt.dev0, nt.cur, nt.resumed = k, i, true
	nt.dispatched, nt.combined, nt.dispXBytes = false, false, 0
	return nil
}

// DispatchAsync enqueues the dispatch of the last RunAsync round on st:
// collective, once per notify round.
func (nt *Notify) DispatchAsync(st device.Stream, a DeviceDispatch) error {
	if nt == nil {
		return fmt.Errorf("internode: dispatch: nil notify")
	}
	if err := nt.asyncReady(st); err != nil {
		return err
	}
	s := nt.shape
	fail := func(format string, args ...any) error {
		return nt.withPeerNode(fmt.Errorf("internode: rank %d: dispatch after notify round %d: "+format, append([]any{nt.rank, nt.round}, args...)...))
	}
	switch {
	case !nt.dev0.ok:
		return fail("run a device-pointer notify round (RunAsync) first")
	case nt.dispatched && !a.Cached:
		return fail("one dispatch per notify round (pass Cached to dispatch its tokens again without one)")
	case nt.resumed && !a.Cached:
		return fail("a resumed layout's round was dispatched already: pass Cached")
	case !nt.dispatched && !nt.resumed && a.Cached:
		return fail("a cached dispatch follows its notify round's dispatch")
	}
	t := nt.dev0.tokens
	switch {
	case a.RouteOnly && (a.X|a.Scales|a.Weights|a.RecvX|a.RecvScales|a.RecvTopK|a.RecvWeights|a.RecvSrcToken) != 0:
		return fail("a route-only dispatch takes no rows, weights nor receive outputs")
	case a.RouteOnly && a.FP8:
		return fail("a route-only dispatch is BF16")
	case !a.RouteOnly && t > 0 && (a.X == 0 || a.FP8 && a.Scales == 0):
		return fail("no rows (or FP8 rows without scales) for %d tokens", t)
	case a.RecvX != 0 && (a.RecvTopK == 0 || a.RecvSrcToken == 0 || a.FP8 && a.RecvScales == 0):
		return fail("receive outputs: x, top-k ids, source tokens (and FP8 scales) go together")
	case !aligned4(a.X, a.Scales, a.Weights, a.RecvX, a.RecvScales, a.RecvWeights, a.RecvSrcToken) || a.RecvTopK%8 != 0:
		return fail("a pointer is not aligned (4 bytes; top-k ids 8)")
	case a.ScaleStrides[0] < 0 || a.ScaleStrides[1] < 0:
		return fail("negative scale strides %v", a.ScaleStrides)
	}
	if a.ScaleStrides == ([2]int64{}) {
		a.ScaleStrides = [2]int64{int64(s.Hidden / FP8Block), 1}
	}
	if err := nt.comm.Check(); err != nil {
		nt.err = fail("%w", err)
		return nt.err
	}
	nt.dispatched, nt.combined = true, false
	nt.dev0.dispatched, nt.kept[nt.cur].dispatched = true, true
	nt.dispRound++
	err := nt.launchDispatch(st, nt.dev0.ids, t, a) // reads resumed
	nt.resumed = false
	if err != nil {
		nt.err = fail("%w", err)
		return nt.err
	}
	return nil
}

// CombineAsync enqueues the combine of the last DispatchAsync on st:
// collective, once per dispatch.
func (nt *Notify) CombineAsync(st device.Stream, a DeviceCombine) error {
	if nt == nil {
		return fmt.Errorf("internode: combine: nil notify")
	}
	if err := nt.asyncReady(st); err != nil {
		return err
	}
	fail := func(format string, args ...any) error {
		return nt.withPeerNode(fmt.Errorf("internode: rank %d: combine after notify round %d: "+format, append([]any{nt.rank, nt.round}, args...)...))
	}
	switch {
	case !nt.dev0.ok || !nt.dispatched || nt.combined:
		return fail("run a device-pointer notify round and its dispatch first (one combine per round)")
	case a.Partial != PartialBF16 && a.Partial != PartialFP32:
		return fail("partial format %d", a.Partial)
	case nt.dev0.tokens > 0 && a.Out == 0:
		return fail("no output for %d tokens", nt.dev0.tokens)
	case a.Weights != 0 && nt.dev0.tokens > 0 && a.OutWeights == 0:
		return fail("weights without an output for them")
	case !aligned4(a.Y, a.Weights, a.Bias0, a.Bias1, a.Out, a.OutWeights):
		return fail("a pointer is not 4-byte aligned")
	}
	if err := nt.comm.Check(); err != nil {
		nt.err = fail("%w", err)
		return nt.err
	}
	nt.combined = true
	nt.combRound++
	if err := nt.launchCombine(st, nt.dev0.tokens, a.Weights != 0, a); err != nil {
		nt.err = fail("%w", err)
		return nt.err
	}
	return nil
}

// Check reports what the device-pointer calls cannot return: a wait of an
// enqueued kernel that gave up (the communicator's watchdog record, which
// names the peer), after which the Notify refuses further calls; or the
// Notify's earlier failure or Close. Nil while every round went well so
// far. Cheap: it reads host memory only.
func (nt *Notify) Check() error {
	if nt == nil {
		return fmt.Errorf("internode: notify: nil")
	}
	if nt.err != nil {
		return nt.err
	}
	if nt.comm == nil {
		return fmt.Errorf("internode: notify: not set up by NewNotify")
	}
	if err := nt.comm.Check(); err != nil {
		nt.err = nt.withPeerNode(fmt.Errorf("internode: rank %d: after notify round %d: %w", nt.rank, nt.round, err))
		return nt.err
	}
	return nil
}

// DevicePointers says whether this Notify takes the device-pointer form:
// its device runs the kernels (a GPU, or the CPU emulation). The host
// backend takes the slice form only.
func (nt *Notify) DevicePointers() bool {
	return nt != nil && nt.kern != nil && nt.err == nil
}
