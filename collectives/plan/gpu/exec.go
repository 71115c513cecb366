package gpu

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Executor runs plans on this rank's GPU over a channels communicator. All
// ranks of the plan run the same calls in the same order (collective):
// the first call with a given plan, size, mode and buffers builds its
// launch context (channels, remote buffers, tables: collective setup over
// the bootstrap), later ones only launch. Methods are safe for concurrent
// use, but calls of one plan context are serialised by the stream order the
// caller gives them.
type Executor struct {
	comm *channels.Communicator
	dev  device.Device

	mu       sync.Mutex
	contexts map[contextKey]*launchContext
	proxy    *channels.Proxy
	nextTag  int
	closed   bool
}

type contextKey struct {
	plan      *plan.Plan
	bytes     uint64
	inPlace   bool
	send      uintptr
	recv      uintptr
	packet    plan.PacketType
	dtypeSize int
}

// Args describe one execution. Send and Recv are whole allocations of this
// rank's device (as Device.Alloc returned them: peers map them through
// CUDA IPC); in-place plans take the same buffer for both.
type Args struct {
	Plan    *plan.Plan
	Bytes   uint64 // the message size (see plan.Plan.SizesFor)
	InPlace bool
	Send    device.Buffer
	Recv    device.Buffer
	DType   plan.DataType
	Packet  plan.PacketType // LL16 (the zero value) or LL8
	Stream  device.Stream   // nil: the device's default stream
}

var errNilExecutor = errors.New("plan executor: nil executor (or built on a nil communicator)")

// NewExecutor returns an executor over comm. Close it before comm. On a
// nil comm it returns nil, whose methods fail.
func NewExecutor(comm *channels.Communicator) *Executor {
	if comm == nil {
		return nil
	}
	x := &Executor{comm: comm, dev: comm.Device(), contexts: map[contextKey]*launchContext{}, nextTag: 1 << 20}
	// Load the interpreter now: loading a module waits for the kernels
	// running in the context, and at the first execution other ranks'
	// kernels (on this GPU, or this rank's earlier ones) may be spinning
	// on this rank. A failure shows again, with context, at the launch.
	for _, k := range kernelByType {
		_ = x.dev.Preload(k)
	}
	return x
}

func (x *Executor) errorf(format string, a ...any) error {
	return fmt.Errorf("plan executor: rank %d: "+format, append([]any{x.comm.Rank()}, a...)...)
}

// Run enqueues one execution on a.Stream. Device-side timeouts surface
// through Check (or the communicator's Check) after the stream completes.
func (x *Executor) Run(ctx context.Context, a Args) error {
	if x == nil {
		return errNilExecutor
	}
	if a.Plan == nil {
		return x.errorf("no plan")
	}
	if ctx == nil {
		return x.errorf("nil context")
	}
	// A finished context launches nothing.
	if err := context.Cause(ctx); err != nil {
		return x.errorf("%s: not launched: %w", a.Plan.Name, err)
	}
	// The host backend knows its allocations (the CUDA path maps the
	// buffers through IPC, which fails on anything but an allocation).
	if rc, ok := x.dev.(device.RangeChecker); ok {
		for _, b := range []struct {
			what string
			buf  device.Buffer
		}{{"send", a.Send}, {"recv", a.Recv}} {
			if err := rc.CheckRange(b.buf.Ptr, b.buf.Size); err != nil {
				return x.errorf("%s: %s buffer: %w", a.Plan.Name, b.what, err)
			}
		}
	}
	if err := a.Plan.CheckWorld(x.comm.Size()); err != nil {
		return x.errorf("%w", err)
	}
	if a.InPlace && a.Send.Ptr != a.Recv.Ptr {
		return x.errorf("%s: in-place execution takes one buffer: Send == Recv", a.Plan.Name)
	}
	if a.Packet != plan.LL16 && a.Packet != plan.LL8 {
		return x.errorf("%s: packet type %v", a.Plan.Name, a.Packet)
	}
	key := contextKey{plan: a.Plan, bytes: a.Bytes, inPlace: a.InPlace, send: a.Send.Ptr, recv: a.Recv.Ptr,
		packet: a.Packet}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return x.errorf("closed")
	}
	lc := x.contexts[key]
	if lc == nil {
		// Every block of a plan waits on other ranks: on a GPU several
		// ranks share, all of them must be resident at once.
		if _, err := x.comm.Placement(ctx); err != nil {
			return x.errorf("%w", err)
		}
		if err := x.comm.CheckSpinLaunch("plan "+a.Plan.Name, len(a.Plan.GPUs[x.comm.Rank()].Threadblocks)); err != nil {
			return err
		}
		var err error
		if lc, err = x.build(ctx, a); err != nil {
			return x.errorf("%s (%d bytes): %w", a.Plan.Name, a.Bytes, err)
		}
		x.contexts[key] = lc
	}
	return lc.launch(a.DType, a.Stream)
}

// Check reports a device-side timeout or a proxy failure of any execution.
func (x *Executor) Check() error {
	if x == nil {
		return errNilExecutor
	}
	return x.comm.Check()
}

// Close frees every context's device memory and stops the proxy. The
// communicator keeps its registrations and connections until its Close.
func (x *Executor) Close() error {
	if x == nil {
		return errNilExecutor
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	var errs []error
	for _, lc := range x.contexts {
		errs = append(errs, lc.free())
	}
	x.contexts = nil
	if x.proxy != nil {
		errs = append(errs, x.proxy.Close())
	}
	return errors.Join(errs...)
}

// launchContext is what one (plan, size, buffers) needs on the device.
type launchContext struct {
	x       *Executor
	res     *plan.Resolved
	grid    int
	threads int
	smem    int
	wrap    uint64
	owned   []device.Buffer // scratch, tables, context
	arrays  []*channels.DeviceArray
	ctx     device.Buffer // the goep_plan_ctx
	args    *device.Args
}

func (lc *launchContext) free() error {
	var errs []error
	for _, a := range lc.arrays {
		errs = append(errs, a.Close())
	}
	for _, b := range lc.owned {
		errs = append(errs, lc.x.dev.Free(b))
	}
	lc.arrays, lc.owned = nil, nil
	return errors.Join(errs...)
}

// kernelByType names the interpreter of each element type
// (kernels/plan_exec.cu, module "plan").
var kernelByType = map[plan.DataType]string{
	plan.BF16: "goep_plan_exec_bf16", plan.FP16: "goep_plan_exec_fp16",
	plan.FP32: "goep_plan_exec_fp32", plan.Int32: "goep_plan_exec_int32",
}

func init() {
	var names []string
	for _, dt := range []plan.DataType{plan.BF16, plan.FP16, plan.FP32, plan.Int32} {
		names = append(names, kernelByType[dt])
	}
	kernels.Register(kernels.Module{Name: "plan", File: "plan_exec.cu", Kernels: names})
}

func (lc *launchContext) launch(dt plan.DataType, s device.Stream) error {
	name, ok := kernelByType[dt]
	if !ok {
		return lc.x.errorf("%s: data type %v is not supported (bf16, fp16, fp32, int32)", lc.res.Plan, dt)
	}
	if err := lc.x.comm.Check(); err != nil {
		return err
	}
	if err := lc.x.dev.Launch(name, device.D1(lc.grid), device.D1(lc.threads), lc.smem, s, lc.args); err != nil {
		return lc.x.errorf("%s: launch: %w", lc.res.Plan, err)
	}
	return nil
}

// alloc allocates n bytes the context owns, zeroed on the default stream
// (build synchronises it before the first launch).
func (lc *launchContext) alloc(n int) (device.Buffer, error) {
	b, err := lc.x.dev.Alloc(max(n, 16))
	if err != nil {
		return b, err
	}
	lc.owned = append(lc.owned, b)
	if err := lc.x.dev.MemsetAsync(b.Ptr, 0, b.Size, nil); err != nil {
		return b, err
	}
	return b, nil
}

// upload copies data into a new owned buffer.
func (lc *launchContext) upload(data []byte) (uintptr, error) {
	b, err := lc.x.dev.Alloc(max(len(data), 16))
	if err != nil {
		return 0, err
	}
	lc.owned = append(lc.owned, b)
	if err := lc.x.dev.CopyIn(b.Ptr, data); err != nil {
		return 0, err
	}
	return b.Ptr, nil
}

// build sets up a's context (collective): every rank runs the same steps in
// the same order, since each step's exchanges pair with the peers' ones.
func (x *Executor) build(ctx context.Context, a Args) (_ *launchContext, err error) {
	b := &builder{x: x, a: a, me: x.comm.Rank()}
	rerr := b.resolve()
	var prog *program
	if rerr == nil {
		prog, rerr = encode(b.res)
	}
	// Every rank states what it is about to build (or why it cannot)
	// before any of them allocates or waits on a peer: a plan, size or mode
	// that differs between ranks fails all of them at once, named, instead
	// of corrupting memory or ending in a bootstrap timeout.
	if err := channels.AgreeConfig(ctx, x.comm.Bootstrap(), "Executor", buildFields(a), rerr); err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	b.lc = &launchContext{x: x, res: b.res, grid: len(b.res.Blocks), threads: min(max(b.res.Threads, 32), 1024), wrap: b.res.ScratchWrap}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.lc.free())
		}
	}()
	b.tag = x.nextTag
	x.nextTag += 1 << 12 // a context's exchanges use tags [tag, tag+4096)
	if err := b.exchangeBuffers(ctx); err != nil {
		return nil, err
	}
	if err := b.remoteTables(); err != nil {
		return nil, err
	}
	if err := b.memoryChannels(ctx); err != nil {
		return nil, err
	}
	if err := b.portChannels(ctx); err != nil {
		return nil, err
	}
	if err := b.uploadContext(prog); err != nil {
		return nil, err
	}
	// The zeroed scratch, barriers and flag before any launch (the caller's
	// stream need not be the default one).
	if err := x.dev.DefaultStream().Synchronize(); err != nil {
		return nil, err
	}
	// Every rank has its context before any launches: a launch writes
	// peers' buffers.
	if err := x.comm.Barrier(ctx); err != nil {
		return nil, err
	}
	return b.lc, nil
}

// buildFields are what every rank's build must agree on: the plan (by
// content), the message size, the mode and the packet layout.
func buildFields(a Args) []string {
	js, _ := json.Marshal(a.Plan)
	sum := sha256.Sum256(js)
	return []string{
		fmt.Sprintf("Plan=%.40q#%x", a.Plan.Name, sum[:6]),
		fmt.Sprintf("Bytes=%d", a.Bytes),
		fmt.Sprintf("InPlace=%v", a.InPlace),
		fmt.Sprintf("Packet=%v", a.Packet),
	}
}

// builder carries one build's state from step to step.
type builder struct {
	x   *Executor
	a   Args
	me  int
	tag int
	lc  *launchContext

	all []*plan.Resolved // every rank's part of the plan
	res *plan.Resolved   // this rank's

	theirs [][3]channels.RegisteredMemory // rank -> input, output, scratch views

	remotePtrs, remoteHalves, remotePortIDs []byte // per remote buffer, as the kernel reads them
	localIDs                                [3]channels.MemoryID
	semsDev, portsPtr                       uintptr // device arrays of memory semaphores and port channels
}

// resolve resolves every rank's part (channels pair across ranks) and
// refuses what the executor cannot run.
func (b *builder) resolve() (err error) {
	p, a := b.a.Plan, b.a
	b.all = make([]*plan.Resolved, len(p.GPUs))
	for r := range b.all {
		if b.all[r], err = plan.Resolve(p, r, a.Bytes, a.InPlace); err != nil {
			return err
		}
	}
	res := b.all[b.me]
	b.res = res
	if len(res.SwitchChannels) > 0 {
		return errors.New("the plan uses switch channels (NVLink multicast), which goep never uses")
	}
	for _, blk := range res.Blocks {
		for _, in := range blk.Instrs {
			if in.Code.Switch() {
				return fmt.Errorf("threadblock %d: op %d (%s) needs NVLink multicast, which goep never uses", blk.ID, in.OpIndex, in.Code)
			}
		}
	}
	if err := checkPairs(b.all); err != nil {
		return err
	}
	if a.InPlace {
		if n := max(res.InputBytes, res.OutputBytes); uint64(a.Recv.Size) < n {
			return fmt.Errorf("in place: a buffer of %d bytes; the plan needs %d", a.Recv.Size, n)
		}
	} else if uint64(a.Send.Size) < res.InputBytes || uint64(a.Recv.Size) < res.OutputBytes {
		return fmt.Errorf("buffers of %d and %d bytes; the plan needs input %d and output %d", a.Send.Size, a.Recv.Size, res.InputBytes, res.OutputBytes)
	}
	return nil
}

// exchangeBuffers registers this rank's three buffers (input, output and a
// new scratch), exchanges them with every peer and keeps each rank's views.
func (b *builder) exchangeBuffers(ctx context.Context) (err error) {
	x, a, me := b.x, b.a, b.me
	scratch, err := b.lc.alloc(int(b.res.ScratchBytes))
	if err != nil {
		return err
	}
	var peers []int
	for r := range b.all {
		if r != me {
			peers = append(peers, r)
		}
	}
	// The whole allocations, then each rank's input, output and scratch as
	// slices of them (in place, input and output share one allocation).
	var whole [3]channels.RegisteredMemory
	if whole[0], err = x.comm.RegisterMemory(a.Send); err != nil {
		return err
	}
	whole[1] = whole[0]
	if a.Recv.Ptr != a.Send.Ptr {
		if whole[1], err = x.comm.RegisterMemory(a.Recv); err != nil {
			return err
		}
	}
	if whole[2], err = x.comm.RegisterMemory(scratch); err != nil {
		return err
	}
	b.theirs = make([][3]channels.RegisteredMemory, len(b.all))
	for k := range whole {
		got, err := x.comm.ExchangeMemory(ctx, whole[k], peers, b.tag+k)
		if err != nil {
			return err
		}
		for i, q := range peers {
			b.theirs[q][k] = got[i]
		}
		b.theirs[me][k] = whole[k]
	}
	for q := range b.all {
		for k := range b.theirs[q] {
			if b.theirs[q][k], err = bufferView(b.theirs[q][k], b.all[q], k); err != nil {
				return fmt.Errorf("rank %d's %s: %w", q, [3]string{"input", "output", "scratch"}[k], err)
			}
		}
	}
	return nil
}

// remoteTables fills the pointer and scratch-half tables of the plan's
// remote buffers.
func (b *builder) remoteTables() error {
	res := b.res
	n := max(len(res.RemoteBuffers), 1)
	b.remotePtrs, b.remoteHalves, b.remotePortIDs = make([]byte, 8*n), make([]byte, 8*n), make([]byte, 4*n)
	for i, rb := range res.RemoteBuffers {
		if rb.Rank == b.me || rb.Rank < 0 || rb.Rank >= len(b.all) {
			return fmt.Errorf("remote buffer %d: owner rank %d", i, rb.Rank)
		}
		binary.LittleEndian.PutUint64(b.remotePtrs[8*i:], uint64(b.theirs[rb.Rank][bufIndex(rb.Kind)].Ptr()))
		if rb.Kind == plan.BufScratch {
			binary.LittleEndian.PutUint64(b.remoteHalves[8*i:], b.all[rb.Rank].ScratchHalf)
		}
	}
	return nil
}

// memoryChannels makes one memory semaphore per memory channel, paired by
// (peer, tag), and uploads them.
func (b *builder) memoryChannels(ctx context.Context) error {
	memSems, err := b.x.semaphores(ctx, b.res.MemoryChannels, b.tag+16, false)
	if err != nil || len(memSems) == 0 {
		return err
	}
	semArray, err := b.x.comm.UploadSemaphores(memSems)
	if err != nil {
		return err
	}
	b.lc.arrays = append(b.lc.arrays, semArray)
	b.semsDev = semArray.Ptr()
	return nil
}

// portChannels makes the port channels: host-to-device semaphores served
// by the proxy; the proxy knows this rank's buffers and every remote buffer
// reached through ports.
func (b *builder) portChannels(ctx context.Context) error {
	x, res := b.x, b.res
	if len(res.PortChannels) == 0 {
		return nil
	}
	px, err := x.proxyLocked()
	if err != nil {
		return err
	}
	regs := b.theirs[b.me]
	for k := range regs {
		if b.localIDs[k], err = px.AddMemory(regs[k]); err != nil {
			return err
		}
	}
	for i, rb := range res.RemoteBuffers {
		id, err := px.AddMemory(b.theirs[rb.Rank][bufIndex(rb.Kind)])
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(b.remotePortIDs[4*i:], uint32(id))
	}
	hostSems, err := x.semaphores(ctx, res.PortChannels, b.tag+16+plan.MaxChannelsPerBlock*64, true)
	if err != nil {
		return err
	}
	chans := make([]*channels.PortChannel, len(hostSems))
	for i, s := range hostSems {
		peer := res.PortChannels[i].Peer
		dstID, err := px.AddMemory(b.theirs[peer][2])
		if err != nil {
			return err
		}
		if chans[i], err = px.NewPortChannel(s.(*channels.HostSemaphore), dstID, b.localIDs[2]); err != nil {
			return err
		}
	}
	arr, err := x.comm.UploadPortChannels(chans)
	if err != nil {
		return err
	}
	b.lc.arrays = append(b.lc.arrays, arr)
	b.portsPtr = arr.Ptr()
	return px.Start()
}

// uploadContext uploads the program, the tables and the plan's state, then
// the goep_plan_ctx that points at them, and makes the kernel's arguments.
func (b *builder) uploadContext(prog *program) error {
	lc, res, regs := b.lc, b.res, b.theirs[b.me]
	var ptrs [5]uintptr // blocks, instructions, remote pointers, remote halves, remote port ids
	for i, data := range [][]byte{prog.blocks, prog.instrs, b.remotePtrs, b.remoteHalves, b.remotePortIDs} {
		p, err := lc.upload(data)
		if err != nil {
			return err
		}
		ptrs[i] = p
	}
	sems := make([]byte, 8*max(len(res.Semaphores), 1))
	for i, v := range res.Semaphores {
		binary.LittleEndian.PutUint64(sems[8*i:], uint64(v))
	}
	semsPtr, err := lc.upload(sems)
	if err != nil {
		return err
	}
	bars, err := lc.alloc(8 * maxBarriers)
	if err != nil {
		return err
	}
	flag, err := lc.alloc(8)
	if err != nil {
		return err
	}
	smemInstrs := 0
	if prog.maxInstrs*instrSize <= smemLimit {
		smemInstrs = prog.maxInstrs
		lc.smem = prog.maxInstrs * instrSize
	}
	c := make([]byte, ctxSize)
	fields := []uint64{
		uint64(regs[0].Ptr()), uint64(regs[1].Ptr()), uint64(regs[2].Ptr()), res.ScratchHalf,
		uint64(ptrs[0]), uint64(ptrs[1]), uint64(b.semsDev), uint64(b.portsPtr),
		uint64(ptrs[2]), uint64(ptrs[3]), uint64(ptrs[4]),
		uint64(b.localIDs[0]) | uint64(b.localIDs[1])<<32, uint64(b.localIDs[2]),
		uint64(semsPtr), uint64(bars.Ptr), uint64(flag.Ptr), uint64(b.x.comm.Watchdog()),
		packetBytes(b.a.Packet), uint64(smemInstrs),
	}
	for i, v := range fields {
		binary.LittleEndian.PutUint64(c[8*i:], v)
	}
	ctxPtr, err := lc.upload(c)
	if err != nil {
		return err
	}
	lc.args = device.NewArgs(2).Ptr(ctxPtr).U64(res.ScratchWrap)
	return nil
}

// packetBytes is the kernel's packet_type: 16 for LL16, 8 for LL8.
func packetBytes(t plan.PacketType) uint64 {
	if t == plan.LL8 {
		return 8
	}
	return 16
}

// bufferView is the part of a rank's registered allocation that the plan
// calls its input (k 0), output (1) or scratch (2). In place, the smaller
// of input and output is the rank's piece of the larger (plan.InPlaceInput).
func bufferView(m channels.RegisteredMemory, r *plan.Resolved, k int) (channels.RegisteredMemory, error) {
	off, n := uint64(0), [3]uint64{r.InputBytes, r.OutputBytes, r.ScratchBytes}[k]
	if r.InPlace && k == 0 && r.InputBytes < r.OutputBytes {
		off = uint64(r.Rank) * r.InputBytes
	}
	if r.InPlace && k == 1 && r.OutputBytes < r.InputBytes {
		off = uint64(r.Rank) * r.OutputBytes
	}
	return m.Slice(int(off), int(max(n, 1)))
}

func bufIndex(k plan.BufKind) int {
	switch k {
	case plan.BufOutput:
		return 1
	case plan.BufScratch:
		return 2
	}
	return 0
}

// semaphores builds one semaphore per channel: connections to each peer
// with the channel's tag (grouped by tag so every group's exchanges send
// before they receive), memory or host-to-device semaphores over them.
func (x *Executor) semaphores(ctx context.Context, chans []plan.Channel, tagBase int, host bool) ([]channels.Semaphore, error) {
	out := make([]channels.Semaphore, len(chans))
	byTag := map[int][]int{} // tag -> channel indices
	maxTag := -1
	for i, ch := range chans {
		byTag[ch.Tag] = append(byTag[ch.Tag], i)
		maxTag = max(maxTag, ch.Tag)
	}
	if maxTag >= plan.MaxChannelsPerBlock*64 {
		return nil, fmt.Errorf("channel tag %d is too large", maxTag)
	}
	for t := 0; t <= maxTag; t++ {
		idx := byTag[t]
		if len(idx) == 0 {
			continue
		}
		peers := make([]int, len(idx))
		for j, i := range idx {
			peers[j] = chans[i].Peer
		}
		conns, err := x.comm.ConnectAll(ctx, peers, tagBase+t)
		if err != nil {
			return nil, err
		}
		if host {
			sems, err := x.comm.NewHostSemaphores(ctx, conns)
			if err != nil {
				return nil, err
			}
			for j, i := range idx {
				out[i] = sems[j]
			}
		} else {
			sems, err := x.comm.NewMemorySemaphores(ctx, conns)
			if err != nil {
				return nil, err
			}
			for j, i := range idx {
				out[i] = sems[j]
			}
		}
	}
	return out, nil
}

func (x *Executor) proxyLocked() (*channels.Proxy, error) {
	if x.proxy == nil {
		px, err := x.comm.NewProxy(channels.ProxyConfig{})
		if err != nil {
			return nil, err
		}
		x.proxy = px
	}
	return x.proxy, nil
}

// checkPairs makes sure every channel has its partner: the k-th channel of
// a type from A to B needs a k-th from B to A, or setup would wait forever.
func checkPairs(all []*plan.Resolved) error {
	count := func(chans []plan.Channel, peer int) int {
		n := 0
		for _, c := range chans {
			if c.Peer == peer {
				n++
			}
		}
		return n
	}
	for a, ra := range all {
		for _, typ := range []struct {
			name string
			get  func(*plan.Resolved) []plan.Channel
		}{{"memory", func(r *plan.Resolved) []plan.Channel { return r.MemoryChannels }},
			{"port", func(r *plan.Resolved) []plan.Channel { return r.PortChannels }}} {
			for _, c := range typ.get(ra) {
				if c.Peer < 0 || c.Peer >= len(all) || c.Peer == a {
					return fmt.Errorf("gpu %d: %s channel to rank %d", a, typ.name, c.Peer)
				}
				if n, m := count(typ.get(ra), c.Peer), count(typ.get(all[c.Peer]), a); n != m {
					return fmt.Errorf("gpu %d has %d %s channels to gpu %d, which has %d back: the GPU executor needs them paired", a, n, typ.name, c.Peer, m)
				}
			}
		}
	}
	return nil
}
