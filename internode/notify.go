package internode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// Notify, the first stage of internode dispatch: the count exchange
// (DESIGN.md, "Notify"), on the host backend. It is the Go twin of the
// notify kernel (kernels/internode.cu): it works on the same device memory with the same
// protocol (per-round staging, port-channel puts and atomic adds across
// nodes, stores plus a release add inside a node, waits bounded by the
// communicator's watchdog), so that the GPU kernel can be checked against
// it step by step. Where the kernels run (a GPU, or the CPU emulation),
// Run launches goep_internode_notify instead (kernel.go).
//
// Memory of each rank (all counts int32, counters uint64):
//
//	RDMA buffer (registered, reached by ranks of the same local index on
//	other nodes only through port channels):
//	  net counters [N]     counter a: arrivals from source node a
//	  recv [2][N][B]       round parity, source node a, count block
//	  send [2][N][B]       round parity, destination node n, count block
//	  B = P + 1 + P*LE: tokens per local rank of the destination node,
//	  tokens for the node, tokens per expert of the node's experts.
//	NVLink workspace (mapped by the other ranks of the node):
//	  counters [P]         counter i: arrivals from forwarder (local) i
//	  recv [2][P][N][1+LE] parity, forwarder i, source node a: tokens of
//	                       source (a, i) for this rank, then per local expert
//
// Round e (1, 2, ...) of rank (a, i):
//  1. count its tokens per rank, node and expert (layout, as
//     ReferenceLayout but computed here from the ids);
//  2. for every node n: stage the block for n in send[e%2][n], then, for
//     n != a, put it into recv[e%2][a] of forwarder (n, i) and add 1 to that
//     forwarder's net counter a, on the same port channel (the transport
//     applies both in order, so the counter never overtakes the counts); for
//     n = a copy the block into its own recv and add to its own counter;
//  3. as forwarder: wait until every net counter a reaches e, then for each
//     local rank l write, per source node a, the count of (a, i)'s tokens
//     for l and l's per-expert counts into l's workspace recv[e%2][i][a],
//     and release-add 1 to l's counter i;
//  4. as receiver: wait until every counter i reaches e and read.
//
// Counters only grow (round e waits for e), so nothing is reset between
// rounds. Two parities suffice: a rank writes a parity again in round
// e+2 only after finishing round e+1, which needed the peer's round e+1
// writes, which the peer issued only after it had read its round e data.
// The same argument covers the send staging, which a put may still be
// reading when the sender's round ends.

// NotifyConfig configures NewNotify.
type NotifyConfig struct {
	// Tag pairs the setup exchanges with the peers'; Tag and Tag+1 are
	// used, every rank must pass the same.
	Tag int
	// Alignment rounds TokensPerLocalExpert up (<= 1: no rounding).
	Alignment int
	// MaxTokens, when > 0, sizes the dispatch buffers (relay rows,
	// staging, receive rows: dispatch.go) for at most this many tokens per
	// rank and round, so that Notify.Dispatch can follow each round; 0
	// allocates notify's memory only. On a device that runs the kernels
	// (a GPU, or the CPU emulation) it must be > 0: it also sizes the
	// device copy of each round's top-k ids, and Run takes at most
	// MaxTokens tokens there.
	MaxTokens int
	// SMs is the grid (blocks, about one per SM) of the dispatch and
	// combine kernels where kernels run; 0 means DefaultSMs, capped by the
	// device's SMs and by the spin budget of ranks sharing a GPU (every
	// block of every such rank must be resident at once). A value above
	// the spin budget is refused at setup. Ranks may pass different
	// values (each grid counts its own blocks).
	SMs int
	// DefaultSMs replaces DefaultSMs as the grid when SMs is 0, capped the
	// same way (0: DefaultSMs). The Buffer passes DefaultSMsOver its
	// network transport.
	DefaultSMs int
	// Threads per block of the dispatch and combine kernels: a multiple of
	// 32 in 32..512; 0 means DefaultThreads on a GPU and
	// DefaultEmulatedThreads in the CPU emulation (its threads are OS
	// threads).
	Threads int
	// Split divides that grid into sender, forwarder and receiver blocks
	// (Split; the zero value: DefaultSplit of the grid). A split naming
	// counts sets the grid to their total (SMs must then be 0 or the
	// same).
	Split Split
	// PutBytes, where kernels run, cuts each dispatch and combine block's
	// run of rows to another node into puts of about this many bytes
	// (at most 16 per block and node), each pushed as soon as its rows are
	// packed (dispatch) or reduced (combine), so that the transport copies
	// and sends the first piece while the block writes the rest instead of
	// starting only after the block's whole run. 0 means one put per node
	// and block; at most MaxPutBytes. The Buffer reads it from
	// $GOEP_INTERNODE_PUT_BYTES (PutBytesEnv, ParsePutBytes: unset gives
	// DefaultPutBytes, the measured best). Ranks may pass different values
	// (the receiver counts arrivals, not puts).
	PutBytes int
	// PutGroups, where each block puts once per node (PutBytes 0), is how
	// many puts the dispatch's sender blocks, and the combine's reducer
	// blocks, send their rows to each node in: consecutive blocks make a
	// group (their runs of rows there are consecutive), the last of a
	// group to finish puts the group's run, and for ForwardBlocks a group
	// is one unit. Fewer, larger puts: the port over CUDA IPC pays a fixed
	// cost a put. 0 means a put per block, as does a count of at least the
	// blocks; at most MaxPutGroups (the kernels cap it at 64 groups, fewer
	// for the combine with many nodes). The Buffer reads it from
	// $GOEP_INTERNODE_PUT_GROUPS (PutGroupsEnv, ParsePutGroups; unset:
	// DefaultPutGroupsOver the transport). Ranks may pass different values.
	PutGroups int
	// ProxyMaxPending is the MaxPending of this Notify's proxy
	// (channels.ProxyConfig): how many operations (puts, atomic adds) it
	// queues on a network connection before it stops to flush it, i.e.
	// waits until everything queued has landed and the peer acknowledged.
	// During that wait the proxy carries out no trigger, so the puts
	// behind it start a round trip late on an emptied connection: with
	// PutBytes pieces a round pushes several times 64 operations. TCP
	// connections bound their own queues (a Write waits for room) and are
	// never flushed for this (channels.ProxyConfig), so the bound applies
	// to the CUDA IPC port transport only. 0: channels' default (64). The Buffer reads it from $GOEP_INTERNODE_PROXY_PENDING
	// (ProxyPendingEnv, ParseProxyPending).
	ProxyMaxPending int
	// ReduceSMs is the grid of the combine's final reduce where kernels
	// run: the source's sum of every node's partials, after the last one
	// landed, in a kernel of its own launched right after the combine
	// kernel (it waits for nothing, so it needs no spin budget). 0 means
	// every SM of the device (the CPU emulation: the combine grid); -1
	// keeps the reduce inside the combine kernel, on its receiver blocks
	// (the SMs budget strictly); at most MaxReduceSMs. The Buffer reads it
	// from $GOEP_INTERNODE_REDUCE_SMS (ReduceSMsEnv, ParseReduceSMs).
	ReduceSMs int
	// ReduceUnits, where kernels run, is when the combine sums each token
	// (ReduceUnits; the zero value ReduceAfter: after the last partial
	// landed). By units, each token as soon as every node's partial of it
	// is in, while the network still carries the others (ReduceSMs is
	// then unused). Every rank must pass the same. The Buffer reads it
	// from $GOEP_INTERNODE_REDUCE_UNITS (ReduceUnitsEnv, ParseReduceUnits;
	// unset: DefaultReduceUnitsOver the network transport and its
	// emulated rate).
	ReduceUnits ReduceUnits
	// SendMemory is where the rows this rank packs for other nodes live,
	// the source of the kernels' network puts: device memory (the zero
	// value), or pinned host memory that the TCP transport sends from
	// without a copy out of the GPU (SendMemory says what each measured).
	// The Buffer reads it from $GOEP_INTERNODE_SEND_MEMORY (SendMemoryEnv,
	// ParseSendMemory).
	SendMemory SendMemory
	// Forward is when the dispatch kernel's forwarders start on the rows
	// from another node (Forward; the zero value ForwardNodes). The
	// Buffer reads it from $GOEP_INTERNODE_FORWARD (ForwardEnv,
	// ParseForward; unset: DefaultForwardOver the network transport).
	// Ranks may pass different values.
	Forward Forward
	// Layouts, where kernels run, is how many notify rounds' layouts the
	// device keeps (the notify kernel's output: counts, relay counts, rank
	// prefix; a few KB each). A device-pointer round writes the one its
	// DeviceNotify.Layout names, and Resume makes a kept one current again,
	// so that a cached dispatch (and a combine after it) of an older round
	// needs no notify round. 0 means 1; at most MaxLayouts. The Buffer
	// keeps one per handle slot.
	Layouts int
}

// MaxLayouts bounds NotifyConfig.Layouts.
const MaxLayouts = 1 << 16

// layouts is Layouts with its default.
func (c NotifyConfig) layouts() int { return max(c.Layouts, 1) }

// NotifyResult is what one rank holds after a notify round.
type NotifyResult struct {
	// Layout is this rank's own layout (per rank, node, expert counts and
	// Invalid; the per-token masks are left nil).
	Layout Layout
	// FromRank[s] is the tokens this rank receives from source rank s.
	FromRank []int32
	// RankPrefix[s] = FromRank[0] + ... + FromRank[s]: the rows from
	// source ranks 0..s (the receive base of s+1).
	RankPrefix []int32
	// NodePrefix[n]: rows from the source ranks of nodes 0..n.
	NodePrefix []int32
	// ViaForwarder[i] is the tokens this rank receives through forwarder
	// (own node, local i): those of sources (a, i) for every node a.
	ViaForwarder []int32
	// Relay[a] is the tokens of source (a, own local index) this rank
	// forwards as a forwarder (they have an expert on this node);
	// RelayPrefix its inclusive prefix sum (relay region bases).
	Relay, RelayPrefix []int32
	// RelayTargets[a*RanksPerNode+l] is how many of those tokens of source
	// node a this forwarder hands to local rank l of its node (itself
	// included): the NVLink leg's per-target counts.
	RelayTargets []int32
	// TokensPerLocalExpert counts received top-k entries per local expert,
	// rounded up to the alignment.
	TokensPerLocalExpert []int
	// Received is the total rows this rank receives.
	Received int
}

// Notify is one rank's notify state: its memory, port channels to the
// ranks of its local index on other nodes and its node peers' workspaces.
// One goroutine uses it at a time (rounds are collective and ordered).
type Notify struct {
	shape Shape
	cfg   NotifyConfig
	comm  *channels.Communicator
	dev   device.Device
	rank  int
	round uint64
	err   error // sticky: a failed round or Close
	// launchCfg is the grid configuration in use (SMs, Threads, Split:
	// the config's, then SetLaunch's and SetSplit's).
	launchCfg NotifyConfig

	// Dispatch state (dispatch.go): the layout of the dispatch regions,
	// the last round's ids and result, dispatch rounds done, wait ids.
	dl                                  dispatchLayout
	lastIDs                             []int64
	last                                *NotifyResult
	dispRound                           uint64
	dispatched                          bool
	dispNetWait, dispNVLWait, readyWait []uint32
	// doneNetWait[n], doneNVLWait[l]: a cached dispatch's waits for the
	// earlier steps of forwarder (n, i) and of local rank l (kernels only).
	doneNetWait, doneNVLWait []uint32
	// steps is the dispatch and combine kernels this rank launched.
	steps uint64
	// Combine state (combine.go): rounds done, whether this round's ran,
	// wait ids.
	combRound  uint64
	dispXBytes int // x bytes of this round's relay rows
	// dev0 is the current round's ids when it is a device-pointer round
	// (RunAsync or Resume: devptr.go), cur its kept layout (the slice
	// form's rounds: 0), kept what each kept layout holds.
	dev0                   devRound
	cur                    int
	kept                   []devRound
	resumed                bool // Resume ran and no dispatch since
	combined               bool
	combNetWait, combReady []uint32

	rdma, nvl device.Buffer
	// rdmaMem, nvlMem: their registrations, withdrawn from the network
	// transport before the memory is freed (Close).
	rdmaMem, nvlMem channels.RegisteredMemory
	// The send memory (sendmem.go): send in device memory, or sendHost in
	// pinned host memory; sendMem its registration (a source of puts only).
	send     device.Buffer
	sendHost *device.HostMapped
	sendMem  channels.RegisteredMemory
	proxy    *channels.Proxy
	// kern is the kernels' state on a device that runs them (a GPU or the
	// CPU emulation: kernel.go); nil on the host backend (Go twins).
	kern *kernelState
	// port[n]: device handle of the port channel to forwarder (n, i);
	// zero for the own node.
	port []devapi.PortChannel
	// peerNVL[l]: base of local rank l's NVLink workspace (own included).
	peerNVL []uintptr
	// transports[j]: the connection to the network peer netPeers[j].
	netPeers   []int
	transports []channels.Transport
	// wait ids naming the peer of each wait, for timeout errors.
	netWait, nvlWait []uint32
}

// Sizes of the two regions, in bytes.
func (s Shape) notifyBlock() int { return s.RanksPerNode + 1 + s.RanksPerNode*s.LocalExperts() }

func (s Shape) rdmaBytes() int {
	return 8*s.Nodes + 2*2*s.Nodes*s.notifyBlock()*4
}
func (s Shape) rdmaRecv(par, a int) int {
	return 8*s.Nodes + ((par*s.Nodes+a)*s.notifyBlock())*4
}
func (s Shape) rdmaSend(par, n int) int {
	return 8*s.Nodes + ((2+par)*s.Nodes+n)*s.notifyBlock()*4
}
func (s Shape) nvlBytes() int {
	return 8*s.RanksPerNode + 2*s.RanksPerNode*s.Nodes*(1+s.LocalExperts())*4
}
func (s Shape) nvlRecv(par, i, a int) int {
	return 8*s.RanksPerNode + (((par*s.RanksPerNode+i)*s.Nodes+a)*(1+s.LocalExperts()))*4
}

// notifyTestHook, when set (tests only), runs after a round's waits of
// one stage and before its reads: a test delays slow readers with it to
// check that writers of later rounds never overwrite what they still read.
var notifyTestHook func(rank int, round uint64, stage int)

// deviceTestHook, when set (tests only), wraps the device a Notify made
// after it uses (the graph-replay test records the launches with it).
var deviceTestHook func(device.Device) device.Device

// Stages of the waits (TimeoutError.Stage).
const (
	stageNotifyNet = 40 + iota
	stageNotifyNVL
	stageNotifyPut
)

// NewNotify sets up notify for this rank of comm: collective over every
// rank. The communicator's topology (channels' nodes: hosts or virtual
// nodes) must be s.Topology.
func NewNotify(ctx context.Context, comm *channels.Communicator, s Shape, cfg NotifyConfig) (_ *Notify, err error) {
	if comm == nil {
		return nil, fmt.Errorf("internode: notify: no communicator")
	}
	rank := comm.Rank()
	fail := func(format string, a ...any) error {
		return fmt.Errorf("internode: rank %d: notify setup: "+format, append([]any{rank}, a...)...)
	}
	// Every rank must agree on the shape and config; compare them first,
	// before any check that could fail on some ranks only and leave the
	// others waiting in a later exchange.
	mine := binary.LittleEndian.AppendUint64(nil, 0)
	for _, v := range []int{s.Nodes, s.RanksPerNode, s.Hidden, s.TopK, s.Experts, cfg.Tag, cfg.Alignment, cfg.MaxTokens, int(cfg.ReduceUnits)} {
		mine = binary.LittleEndian.AppendUint64(mine, uint64(int64(v)))
	}
	all, err := comm.Bootstrap().AllGather(ctx, mine)
	if err != nil {
		return nil, fail("%w", err)
	}
	for r, b := range all {
		if !bytes.Equal(b, mine) {
			return nil, fail("rank %d passed another shape or config than this rank's (%v, hidden %d, top-k %d, %d experts, %+v): every rank must pass the same",
				r, s.Topology, s.Hidden, s.TopK, s.Experts, cfg)
		}
	}
	if err := s.Validate(); err != nil {
		return nil, fail("%w", err)
	}
	if comm.Size() != s.World() {
		return nil, fail("%d ranks in the communicator, %v in the shape", comm.Size(), s.Topology)
	}
	dev := comm.Device()
	if deviceTestHook != nil {
		dev = deviceTestHook(dev)
	}
	if cfg.Tag < 0 || cfg.Tag >= math.MaxInt32 {
		return nil, fail("tag %d out of range", cfg.Tag)
	}
	if cfg.Alignment < 0 || cfg.Alignment > MaxTokens {
		return nil, fail("alignment %d: want 0..%d", cfg.Alignment, MaxTokens)
	}
	ct, err := comm.Topology(ctx)
	if err != nil {
		return nil, fail("%w", err)
	}
	t, err := FromNodeOf(ct.NodeOf)
	if err != nil {
		return nil, fail("%w", err)
	}
	if t != s.Topology {
		return nil, fail("the communicator's nodes are %v, the shape says %v", t, s.Topology)
	}
	if cfg.MaxTokens < 0 || cfg.MaxTokens > MaxTokens {
		return nil, fail("max tokens %d: want 0..%d", cfg.MaxTokens, MaxTokens)
	}
	if cfg.Layouts < 0 || cfg.Layouts > MaxLayouts {
		return nil, fail("layouts %d: want 0..%d", cfg.Layouts, MaxLayouts)
	}
	if cfg.PutBytes < 0 || cfg.PutBytes > MaxPutBytes {
		return nil, fail("put bytes %d: want 0..%d", cfg.PutBytes, MaxPutBytes)
	}
	if cfg.PutGroups < 0 || cfg.PutGroups > MaxPutGroups {
		return nil, fail("put groups %d: want 0..%d", cfg.PutGroups, MaxPutGroups)
	}
	if cfg.ProxyMaxPending < 0 || cfg.ProxyMaxPending > MaxProxyPending {
		return nil, fail("proxy max pending %d: want 0..%d", cfg.ProxyMaxPending, MaxProxyPending)
	}
	if cfg.Forward < ForwardNodes || cfg.Forward > ForwardAuto {
		return nil, fail("%v: want ForwardNodes, ForwardBlocks or ForwardAuto", cfg.Forward)
	}
	if cfg.SendMemory < SendDevice || cfg.SendMemory > SendHost {
		return nil, fail("%v: want SendDevice or SendHost", cfg.SendMemory)
	}
	if cfg.ReduceUnits < ReduceAfter || cfg.ReduceUnits > ReduceByUnits {
		return nil, fail("%v: want ReduceAfter or ReduceByUnits", cfg.ReduceUnits)
	}
	if cfg.ReduceSMs < -1 || cfg.ReduceSMs > MaxReduceSMs {
		return nil, fail("reduce SMs %d: want -1 (inside the combine kernel), 0 (every SM) or 1..%d", cfg.ReduceSMs, MaxReduceSMs)
	}
	dl, err := newDispatchLayout(s, cfg.MaxTokens)
	if err != nil {
		return nil, fail("%w", err)
	}
	nt := &Notify{shape: s, cfg: cfg, comm: comm, dev: dev, rank: rank, dl: dl, kept: make([]devRound, cfg.layouts())}
	defer func() {
		if err != nil {
			err = errors.Join(fail("%w", err), nt.free(false))
			nt = nil
		}
	}()
	if nt.rdma, err = nt.alloc(dl.rdmaBytes); err != nil {
		return nil, err
	}
	if nt.nvl, err = nt.alloc(dl.nvlBytes); err != nil {
		return nil, err
	}
	a, i, p := s.Node(rank), s.Local(rank), s.RanksPerNode

	// Node peers map each other's workspaces (direct memory on the host
	// backend, NVLink on GPUs).
	nvlMem, err := comm.RegisterMemory(nt.nvl)
	if err != nil {
		return nil, err
	}
	nt.nvlMem = nvlMem
	nt.peerNVL = make([]uintptr, p)
	nt.peerNVL[i] = nt.nvl.Ptr
	var local []int
	for l := 0; l < p; l++ {
		if l != i {
			local = append(local, s.Rank(a, l))
		}
	}
	if len(local) > 0 {
		remote, err := comm.ExchangeMemory(ctx, nvlMem, local, cfg.Tag+1)
		if err != nil {
			return nil, err
		}
		for j, m := range remote {
			if !m.Mapped() {
				return nil, fmt.Errorf("rank %d's workspace is not mapped: ranks of one node must share memory", local[j])
			}
			nt.peerNVL[s.Local(local[j])] = m.Ptr()
		}
	}

	// Where kernels run, learn the placement before any connection exists:
	// with ranks sharing a GPU a connection then takes the communicator's
	// one connection stream, made at Placement while no kernel spins (as
	// the Buffer orders it: Placement before NewNotify). Made before
	// Placement, each TCP connection makes its own tx and rx streams,
	// two more streams per peer and rank in the GPU's hardware queues,
	// which ranks sharing a GPU must keep few (ARCHITECTURE.md, "Ranks
	// sharing a GPU"); issue 14's open failure of TestDevicePointersGPU is
	// suspected to be that (DESIGN.md). Collective, as setupKernels'
	// later call, which returns the same result.
	if runsKernels(dev) {
		if _, err := comm.Placement(ctx); err != nil {
			return nil, err
		}
	}

	// Port channels to the ranks of this local index on the other nodes.
	nt.port = make([]devapi.PortChannel, s.Nodes)
	var net []int
	for n := 0; n < s.Nodes; n++ {
		if n != a {
			net = append(net, s.Rank(n, i))
		}
	}
	if len(net) > 0 {
		rdmaMem, err := comm.RegisterMemory(nt.rdma)
		if err != nil {
			return nil, err
		}
		nt.rdmaMem = rdmaMem
		if nt.proxy, err = comm.NewProxy(channels.ProxyConfig{MaxPending: cfg.ProxyMaxPending}); err != nil {
			return nil, err
		}
		mesh, err := nt.proxy.NewPortChannelMesh(ctx, channels.PortMeshConfig{Tag: cfg.Tag, Peers: net, Local: rdmaMem})
		if err != nil {
			return nil, err
		}
		for j, ch := range mesh.Channels {
			nt.port[s.Node(net[j])] = ch.DeviceHandle()
			nt.netPeers = append(nt.netPeers, net[j])
			nt.transports = append(nt.transports, mesh.Connections[j].Transport())
		}
		if err := nt.allocSend(comm); err != nil {
			return nil, err
		}
		if err := nt.proxy.Start(); err != nil {
			return nil, err
		}
	}
	// One wait ID per peer a kernel waits on, named for the timeout error:
	// over the network, rank (n, i) of every node n; over NVLink, every
	// rank (a, l) of this node.
	overNet := func(what string) []uint32 {
		return waitIDs(comm, s.Nodes, func(n int) string {
			return fmt.Sprintf("internode %s rank %d (node %d) over the network", what, s.Rank(n, i), n)
		})
	}
	inNode := func(what string) []uint32 {
		return waitIDs(comm, p, func(l int) string {
			return fmt.Sprintf("internode %s rank %d (node %d)", what, s.Rank(a, l), a)
		})
	}
	nt.netWait = overNet("notify: counts from")
	nt.nvlWait = inNode("notify: counts from forwarder")
	if cfg.MaxTokens > 0 {
		nt.dispNetWait = overNet("dispatch: rows from")
		nt.dispNVLWait = inNode("dispatch: rows from forwarder")
		nt.readyWait = inNode("dispatch: receive bases of")
		nt.combNetWait = overNet("combine: partials from forwarder")
		nt.combReady = inNode("combine: expert outputs of")
		nt.doneNetWait = overNet("cached dispatch: earlier steps of")
		nt.doneNVLWait = inNode("cached dispatch: earlier steps of")
	}
	if runsKernels(dev) {
		if err := nt.setupKernels(ctx); err != nil {
			return nil, err
		}
	}
	return nt, nil
}

func (nt *Notify) alloc(n int) (device.Buffer, error) {
	b, err := nt.dev.Alloc(n)
	if err != nil {
		return b, err
	}
	if err := nt.dev.CopyIn(b.Ptr, make([]byte, n)); err != nil {
		return device.Buffer{}, errors.Join(err, nt.dev.Free(b))
	}
	return b, nil
}

// free stops the proxy, then (meet: Close) meets every rank, then frees.
//
// Why the meeting: a peer's last port-channel puts and atomic adds into
// this rank's RDMA buffer (completion flags of the last step, which nobody
// waits for) may still be in its proxy or on the wire when this rank is
// done. Stopping a proxy drains it: it returns once the receivers
// acknowledged everything it sent. So after every rank has stopped its
// proxy and met, nothing is in flight toward this rank and it may free.
// The registrations are withdrawn from the network transport first: a
// write that still arrives (a peer that timed out of the meeting) is then
// an error naming the memory on this rank's communicator, not a write into
// freed memory. NewNotify's cleanup frees without meeting (its peers may
// not have failed), the withdrawal still guarding it.
func (nt *Notify) free(meet bool) error {
	var errs []error
	if nt.proxy != nil {
		// After a failed round the proxy's drain may fail too (a peer that
		// gave up closed its connection): a consequence of the failure
		// already reported, so only a healthy Notify reports it.
		if err := nt.proxy.Close(); nt.err == nil || errors.Is(nt.err, channels.ErrClosed) {
			errs = append(errs, err)
		}
		nt.proxy = nil
	}
	if meet && nt.comm != nil && nt.comm.Size() > 1 {
		// Bounded by the bootstrap's timeout; its error names the ranks
		// that did not come. Reported even after a failed round: a peer
		// that is gone is what the caller needs to hear.
		if err := nt.comm.Bootstrap().Barrier(context.Background()); err != nil {
			errs = append(errs, fmt.Errorf("internode: rank %d: close: meeting the peers after the drain: %w", nt.rank, err))
		}
	}
	if nt.kern != nil {
		errs = append(errs, nt.kern.free(nt.dev))
		nt.kern = nil
	}
	errs = append(errs, nt.freeSend())
	for _, x := range []struct {
		b *device.Buffer
		m *channels.RegisteredMemory
	}{{&nt.rdma, &nt.rdmaMem}, {&nt.nvl, &nt.nvlMem}} {
		if x.m.Valid() {
			if err := nt.comm.DeregisterMemory(*x.m); err != nil {
				// A peer's operation is still being applied into it:
				// keep the allocation (a leak) rather than free it under
				// the write.
				errs = append(errs, fmt.Errorf("internode: rank %d: close: %w (its %d bytes are not freed)", nt.rank, err, x.b.Size))
				*x.b, *x.m = device.Buffer{}, channels.RegisteredMemory{}
				continue
			}
			*x.m = channels.RegisteredMemory{}
		}
		if x.b.Ptr != 0 {
			errs = append(errs, nt.dev.Free(*x.b))
			*x.b = device.Buffer{}
		}
	}
	return errors.Join(errs...)
}

// twinFailed turns the outcome of a round's twin into the call's error
// and leaves the Notify refusing further calls: bad (a relayed row whose
// place lies outside a region) first, else, when a wait gave up (ok
// false), the watchdog's record of it. Nil when the round succeeded.
func (nt *Notify) twinFailed(fail func(string, ...any) error, ok bool, bad error) error {
	switch {
	case bad != nil:
		nt.err = fail("%w", bad)
	case !ok:
		err := nt.comm.Check()
		if err == nil {
			err = errors.New("a wait gave up without a record")
		}
		nt.err = fail("%w", err)
	default:
		return nil
	}
	return nt.err
}

// Close stops the proxy (waiting until the receivers acknowledged what it
// sent), meets every rank on the bootstrap (bounded by its timeout; the
// error names ranks that did not come), withdraws the memory from the
// network transport and frees it. Collective: after the meeting no peer's
// put or atomic add is in flight toward this rank. Callers finish their
// rounds (streams synchronised) first, and must not close their
// communicators before every rank's Close returned (a barrier after, as
// the Buffer does): a peer's drain needs this rank's connection.
func (nt *Notify) Close() error {
	if nt == nil {
		return fmt.Errorf("internode: notify: nil")
	}
	if errors.Is(nt.err, channels.ErrClosed) {
		return nil
	}
	err := nt.free(true)
	nt.err = fmt.Errorf("internode: rank %d: notify: %w", nt.rank, channels.ErrClosed)
	return err
}

// NetworkPeers lists the ranks this rank reaches over port channels (same
// local index, other nodes) and the transport of each connection: the
// network transport between nodes (TCP today).
func (nt *Notify) NetworkPeers() (peers []int, transports []channels.Transport) {
	if nt == nil {
		return nil, nil
	}
	return append([]int(nil), nt.netPeers...), append([]channels.Transport(nil), nt.transports...)
}

// Rounds is the number of rounds started so far (the epoch of the last;
// a failed round counts, and no round follows it).
func (nt *Notify) Rounds() uint64 {
	if nt == nil {
		return 0
	}
	return nt.round
}

// Run runs one notify round with this rank's top-k ids [T*TopK] (T may be
// 0): collective over every rank. A wait that gives up (a peer that never
// arrives) returns the communicator's *channels.TimeoutError, which names
// the peer; the Notify then refuses further rounds.
func (nt *Notify) Run(ids []int64) (*NotifyResult, error) {
	if nt == nil {
		return nil, fmt.Errorf("internode: notify: nil")
	}
	if nt.err != nil {
		return nil, nt.err
	}
	s := nt.shape
	round := nt.round + 1
	fail := func(format string, a ...any) error {
		return nt.withPeerNode(fmt.Errorf("internode: rank %d: notify round %d: "+format, append([]any{nt.rank, round}, a...)...))
	}
	if len(ids)%s.TopK != 0 || len(ids)/s.TopK > MaxTokens {
		return nil, fail("%d top-k ids: want a multiple of top-k %d, at most %d tokens", len(ids), s.TopK, MaxTokens)
	}
	if nt.kern != nil && len(ids) > nt.kern.maxIDs {
		return nil, fail("%d tokens: the kernels take at most NotifyConfig.MaxTokens = %d", len(ids)/s.TopK, nt.cfg.MaxTokens)
	}
	if err := nt.comm.Check(); err != nil {
		nt.err = fail("%w", err)
		return nil, nt.err
	}
	nt.round++
	var res *NotifyResult
	ok := true
	if nt.kern != nil {
		var err error
		if res, ok, err = nt.notifyKernel(ids); err != nil {
			nt.err = fail("%w", err)
			return nil, nt.err
		}
	} else {
		res, ok = nt.twin(ids, nt.round)
	}
	if err := nt.twinFailed(fail, ok, nil); err != nil {
		return nil, err
	}
	if res.Received > math.MaxInt32 {
		nt.err = fail("receives %d rows, more than the int32 receive bases hold", res.Received)
		return nil, nt.err
	}
	nt.lastIDs = append(nt.lastIDs[:0], ids...)
	nt.last = res
	nt.dev0, nt.cur, nt.resumed = devRound{}, 0, false
	if len(nt.kept) > 0 {
		nt.kept[0] = devRound{} // overwritten by this round
	}
	nt.dispatched = false
	nt.combined = false
	return res, nil
}

// twin is the kernel's work for round e; false when a wait gave up (the
// watchdog holds the record).
func (nt *Notify) twin(ids []int64, e uint64) (*NotifyResult, bool) {
	s := nt.shape
	w, p, nodes, le, k := s.World(), s.RanksPerNode, s.Nodes, s.LocalExperts(), s.TopK
	a, i := s.Node(nt.rank), s.Local(nt.rank)
	par := int(e % 2)
	wd := nt.comm.Watchdog()
	blk := s.notifyBlock()

	// 1. Layout: per token, a bit per rank and per node (the kernel keeps
	// them in registers per warp); counts per expert.
	res := &NotifyResult{Layout: Layout{Tokens: len(ids) / k, TokensPerRank: make([]int32, w),
		TokensPerNode: make([]int32, nodes), TokensPerExpert: make([]int32, s.Experts)}}
	ly := &res.Layout
	hitRank := make([]bool, w)
	hitNode := make([]bool, nodes)
	for t := 0; t < ly.Tokens; t++ {
		clear(hitRank)
		clear(hitNode)
		for _, x := range ids[t*k : (t+1)*k] {
			if x < 0 || x >= int64(s.Experts) {
				if x != -1 {
					ly.Invalid++
				}
				continue
			}
			r := int(x) / le
			ly.TokensPerExpert[x]++
			hitRank[r] = true
			hitNode[r/p] = true
		}
		for r, h := range hitRank {
			if h {
				ly.TokensPerRank[r]++
			}
		}
		for n, h := range hitNode {
			if h {
				ly.TokensPerNode[n]++
			}
		}
	}

	// 2. Stage and send one block per node.
	rdma := nt.rdma.Ptr
	for n := 0; n < nodes; n++ {
		st := rdma + uintptr(s.rdmaSend(par, n))
		j := 0
		put := func(v int32) { devapi.U32(st + uintptr(4*j)).Store(uint32(v)); j++ }
		for l := 0; l < p; l++ {
			put(ly.TokensPerRank[s.Rank(n, l)])
		}
		put(ly.TokensPerNode[n])
		for _, v := range ly.TokensPerExpert[n*p*le : (n+1)*p*le] {
			put(v)
		}
		if n == a {
			dst := rdma + uintptr(s.rdmaRecv(par, a))
			for j := 0; j < blk; j++ {
				devapi.U32(dst + uintptr(4*j)).Store(devapi.U32(st + uintptr(4*j)).Load())
			}
			devapi.U64(rdma + uintptr(8*a)).Add(1)
			continue
		}
		ch := nt.port[n]
		if !devapi.PortPut(ch, uint64(s.rdmaRecv(par, a)), uint64(s.rdmaSend(par, n)), uint64(4*blk), 0, stageNotifyPut) ||
			!devapi.PortAtomicAdd(ch, ch.Dst, uint64(8*a), 1, stageNotifyPut) {
			return nil, false
		}
	}

	// 3. Forward: wait for every source node, then hand each local rank its
	// counts.
	for src := 0; src < nodes; src++ {
		if !devapi.WaitGE64(rdma+uintptr(8*src), e, wd, nt.netWait[src], uint32(s.Rank(src, i)), stageNotifyNet) {
			return nil, false
		}
	}
	if notifyTestHook != nil {
		notifyTestHook(nt.rank, e, stageNotifyNet)
	}
	res.Relay = make([]int32, nodes)
	res.RelayPrefix = make([]int32, nodes)
	res.RelayTargets = make([]int32, nodes*p)
	for l := 0; l < p; l++ {
		ws := nt.peerNVL[l]
		for src := 0; src < nodes; src++ {
			rb := rdma + uintptr(s.rdmaRecv(par, src))
			dst := ws + uintptr(s.nvlRecv(par, i, src))
			c := devapi.U32(rb + uintptr(4*l)).Load()
			devapi.U32(dst).Store(c)
			res.RelayTargets[src*p+l] = int32(c)
			for x := 0; x < le; x++ {
				devapi.U32(dst + uintptr(4*(1+x))).Store(devapi.U32(rb + uintptr(4*(p+1+l*le+x))).Load())
			}
			if l == 0 {
				res.Relay[src] = int32(devapi.U32(rb + uintptr(4*p)).Load())
			}
		}
		devapi.U64(ws + uintptr(8*i)).Add(1)
	}

	// 4. Receive from every forwarder of this node.
	ws := nt.nvl.Ptr
	res.FromRank = make([]int32, w)
	res.ViaForwarder = make([]int32, p)
	perExpert := make([]int, le)
	for f := 0; f < p; f++ {
		if !devapi.WaitGE64(ws+uintptr(8*f), e, wd, nt.nvlWait[f], uint32(s.Rank(a, f)), stageNotifyNVL) {
			return nil, false
		}
	}
	if notifyTestHook != nil {
		notifyTestHook(nt.rank, e, stageNotifyNVL)
	}
	for f := 0; f < p; f++ {
		for src := 0; src < nodes; src++ {
			b := ws + uintptr(s.nvlRecv(par, f, src))
			c := int32(devapi.U32(b).Load())
			res.FromRank[s.Rank(src, f)] = c
			res.ViaForwarder[f] += c
			for x := 0; x < le; x++ {
				perExpert[x] += int(devapi.U32(b + uintptr(4*(1+x))).Load())
			}
		}
	}

	res.RankPrefix = make([]int32, w)
	res.NodePrefix = make([]int32, nodes)
	// Prefixes in int64: W sources of up to MaxTokens each may pass int32,
	// which Run refuses.
	var total int64
	for r, c := range res.FromRank {
		total += int64(c)
		res.RankPrefix[r] = int32(total)
		res.NodePrefix[s.Node(r)] = int32(total)
	}
	res.Received = int(total)
	var sum int32 // at most Nodes*MaxTokens = 2^30
	for n, c := range res.Relay {
		sum += c
		res.RelayPrefix[n] = sum
	}
	if al := nt.cfg.Alignment; al > 1 {
		for x, c := range perExpert {
			perExpert[x] = (c + al - 1) / al * al
		}
	}
	res.TokensPerLocalExpert = perExpert
	return res, true
}

// waitIDs registers n wait IDs with the communicator, named by name(j).
func waitIDs(comm *channels.Communicator, n int, name func(j int) string) []uint32 {
	ids := make([]uint32, n)
	for j := range ids {
		ids[j] = comm.NewWaitID(name(j))
	}
	return ids
}

// withPeerNode adds where a peer whose connection broke sits
// (channels.PeerGoneError: its host died or became unreachable) to err,
// "rank r is node n's local rank l", so that an error names the node that
// disappeared as well as the rank. Other errors pass unchanged.
func (nt *Notify) withPeerNode(err error) error {
	var pg *channels.PeerGoneError
	if err == nil || nt == nil || !errors.As(err, &pg) || pg.Peer < 0 || pg.Peer >= nt.shape.World() {
		return err
	}
	return fmt.Errorf("%w (rank %d is node %d's local rank %d)", err, pg.Peer, nt.shape.Node(pg.Peer), nt.shape.Local(pg.Peer))
}
