// Package ep is the expert-parallel API for Go inference engines: dispatch of
// MoE tokens to the GPUs that hold their experts and combine of the experts'
// outputs back.
//
// # Model
//
// Every rank (one GPU: a process per GPU under torchrun, mpirun, srun or
// `ep-bench launch`, or a goroutine per GPU in one process) builds a
// Buffer with NewBuffer from a channels/bootstrap Bootstrap, its Device
// and a Config. The Buffer owns all the memory the calls need (NVLink
// workspace shared with every peer, handle slots, counters, default
// outputs), allocated once: no call allocates device memory.
//
//	buf, err := ep.NewBuffer(ctx, bs, dev, ep.Config{MaxTokens: 4096, Hidden: 7168, TopK: 8, Experts: 256})
//	res, err := buf.Dispatch(ctx, ep.DispatchArgs{X: x, TopK: ids, Weights: w, Stream: s, After: ready})
//	// experts read res.RecvX / res.RecvTopK / res.RecvWeights on s after res.Done,
//	// and write their outputs into buf.CombineInput(res.Handle)
//	out, err := buf.Combine(ctx, ep.CombineArgs{X: y, Handle: res.Handle, Stream: s})
//	res.Handle.Release() // the handle lives until released
//	res.Done.Release()   // so does the call's Done event, once nothing waits on it
//
// Tensors are device pointers with a shape, a dtype and optional strides
// (Tensor); no tensor framework is involved. Streams belong to the engine:
// wrap a CUstream with WrapStream, or pass nil for the Buffer's own stream.
// Every call may be ordered after an event (After) and records an event
// when its work is done (Done), so communication overlaps the engine's
// compute on other streams. Events are Buffer.NewEvent's (CUevents: an
// engine records them on its streams with cudaEventRecord on Event.Handle,
// or Event.Record), or the engine's own CUevents wrapped with WrapEvent:
// the call's stream waits on them on the device (cuStreamWaitEvent), never
// on the host. Every call that may block takes a ctx; one that has already
// ended is refused before anything is enqueued.
//
// Top-k ids may be I64 (torch.topk's dtype) or I32 in Layout and Dispatch:
// Dispatch widens I32 ids into int64 on the call's stream (a small kernel,
// graph-capturable) before the kernels that read them.
//
// # Modes
//
// A non-cached Dispatch (no Handle) exchanges counts (notify) and moves the
// rows; it returns a Handle. By default the host then waits for the
// received count, as DeepEP does, so the outputs have exact shapes and
// TokensPerExpert is known on the host. With WorstCase the host does not
// wait: outputs have Buffer.MaxRecv rows, the count stays on the device,
// and the call can be captured into a CUDA graph. A cached Dispatch (Handle
// given) reuses the routing of an earlier one: one kernel, no host wait.
// Combine always takes a Handle and never waits on the host. Layout runs
// DeepEP's get_dispatch_layout for the engine (Dispatch does not need it).
//
// The Buffer picks its protocol from the group (Buffer.Mode): ranks of one
// node run intranode (NVLink, or host memory on the host backend); ranks
// on several nodes (hosts, or k virtual nodes of one host: Config.VirtualNodes
// or $GOEP_VIRTUAL_NODES) run internode (package internode: each token
// crosses the network once per destination node, to the rank with its
// source's local index, which forwards it over NVLink), with the same
// calls, handles and views. Internode combine reduces each node's rows
// first and sends one BF16 partial per (token, node), so its sums are
// grouped by node (DeepEP's choice). On CUDA devices internode runs package
// internode's kernels on the callers' tensors in stream order (no host
// copies, no host meeting between steps); on the host backend its Go
// twins. A combine of a handle other than the last dispatch's (or a
// second combine of one) replays that dispatch's route first. On CUDA
// devices a cached dispatch, of any live handle, runs no notify round (the
// device keeps each handle slot's notify layout); on the host backend a
// cached dispatch exchanges the counts again and a replayed route its
// notify round too (package buffer's internode.go and internode_device.go
// say why).
//
// The low-latency (decode) mode is a separate Buffer, LowLatencyBuffer
// (NewLowLatencyBuffer, ep/lowlatency.go, protocol in package lowlatency):
// fixed-shape expert-major (or rank-major) outputs, two alternating buffer
// sets, FP8/UE8M0 cast in the kernel, no host wait, graph-capturable, each
// call optionally split into a send and a receive step, and a mask of
// active ranks; across nodes (hosts, or LowLatencyConfig.VirtualNodes) the
// rows for other nodes go over port channels with the same calls. Goroutine ranks sharing one GPU should issue each step on
// every rank before any rank issues the next (package lowlatency says why).
// Its bad input is refused as here, before any launch; ids outside [-1,
// Experts) are counted on the device per dispatch (LLDispatchResult.Invalid,
// readable in stream order, and LowLatencyBuffer.InvalidIDs on the host).
//
// # What an engine holds, and for how long
//
// Borrowed views. Dispatch returns views into this rank's workspace, where
// the peers' kernels wrote the rows directly; they are valid for work
// ordered before the next Dispatch of the Buffer (in this rank's stream
// order: peers write again only once this rank's stream has entered the
// next dispatch). Combine's default output (no CombineArgs.Out) is valid
// until the next Combine, Layout's outputs until the next Layout. The rule
// is not checked (that would cost a copy); DispatchArgs.Out and
// CombineArgs.Out copy into caller buffers instead. With the environment
// variable GOEP_EP_POISON=1 when the Buffer is built, every expired view
// is overwritten in stream order (NaN rows, 0x80 ids) just before the call
// that ends it, so a test that reads a view too late fails. The combine
// input is fastest in the workspace (CombineInput, or the received rows
// themselves); anything else is copied there first.
//
// Done events. A call without its own Done returns an event of the
// Buffer's pool (Config.Events, default 64), bound to that call: no later
// call records it again while the engine holds it. Event.Release gives it
// back. An engine that holds more than the pool's size makes the ring wrap:
// the oldest held event is recycled for a new call, and its methods then
// return ErrEventRecycled (Handle returns 0; Buffer.Events counts wraps).
//
// Handles. A non-cached dispatch returns a Handle that lives until
// Handle.Release or Close, whatever else runs, so an engine may keep the
// handles of a whole pipeline (layers x micro-batches) and combine them in
// any order. The Buffer has Config.Handles slots (default 16, Handle.Bytes
// each; Buffer.Handles reports them): a dispatch that finds none free is
// refused at once with ErrNoHandleSlot, before anything is launched.
//
// Strided scales. FP8 scales (DispatchArgs.Scales) may have any positive
// element strides: column-major and TMA-aligned layouts from grouped-GEMM
// kernels are read in place by the dispatch kernel. Every other tensor
// argument must be row-major.
//
// Changed in this version (no engine depended on the old forms): Layout
// and Barrier take a ctx; handles no longer expire by least-recent use
// (Handle.Pin is a no-op); a call without Done no longer re-records one
// shared event per operation.
//
// # Validation and failures
//
// Every argument is checked on the host before anything is launched:
// dtypes, shapes against Config and against each other, strides, sizes
// (computed with overflow checks: a size that does not fit is refused,
// never wrapped), token counts, pointer alignment, launch parameters and
// every value packed into a 32-bit kernel argument, handles (another
// Buffer's, released, or none free), events (released or recycled). A
// refusal wraps ErrInvalidArgument and leaves the Buffer usable; so does a
// ctx that has already ended (its error, and ErrTimeout on a deadline). Expert ids cannot be checked on the host without a copy: the
// kernels count ids outside [-1, Experts), treat them as -1, and the call
// reports them as an *InvalidIDsError with a valid result (WorstCase
// dispatches and Layout: Buffer.InvalidIDs after Done); engines with host
// ids can call ValidateTopK. Configurations are checked by SizeHints and
// NewBuffer (experts divisible by ranks, hidden a multiple of 8, of 128
// with FP8, regions that fit WorkspaceBytes, the same on every rank).
//
// Every device-side wait is bounded (Config.Timeout). A rank that never
// arrives makes its peers' waits give up with an error naming the stage and
// the rank (errors.Is(err, ErrTimeout); errors.As to
// *channels.TimeoutError), returned by the call, or for asynchronous work
// by Check and the next call; from then on the Buffer refuses every call
// with it until Close. Bootstrap timeouts (NewBuffer, Close) and context
// deadlines also satisfy errors.Is(err, ErrTimeout).
//
// Every method is safe on a nil receiver (*Buffer, *Handle, *Event) and
// after Close: calls return an error (ErrClosed, ErrExpiredHandle), and
// accessors their zero value, even when polled from another goroutine
// while Close runs.
//
// # Goroutines
//
// A Buffer may be used from any goroutine; its methods are serialised. The
// collective calls (Dispatch, Combine, Barrier, Close) must be issued in
// the same order on every rank, so drive each Buffer from one goroutine per
// rank. Several Buffers (two micro-batches) are independent and may be
// driven concurrently, each by its own goroutine, with distinct Config.Tag
// when built or closed concurrently over one bootstrap. Check, Memory,
// InvalidIDs and the accessors may be called at any time.
//
// Without a GPU everything runs on the host backend (ep.Host devices,
// goroutine ranks), where the kernels' Go twins compute the same results.
package ep
