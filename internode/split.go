package internode

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/goep-dev/goep/channels"
)

// Split divides the dispatch and combine kernels' grid into roles. Each
// block of a split grid takes one role: senders pack this rank's tokens
// into the staging and put them to the forwarders (one put per node and
// block), forwarders copy landed relay rows to their target ranks over
// NVLink, receivers unpack this rank's received rows; in combine the
// senders and forwarders reduce relayed tokens and put the partials back,
// the receivers sum the partials that reach this rank. The roles then
// overlap (a forwarder copies rows of a node that landed while senders
// still pack), at the price of fewer blocks per role. Shared makes every
// block take every role in turn, on its share (no overlap, every block
// busy in every phase). All blocks of the grid must be resident at once
// either way (forwarders wait for this rank's senders): the total counts
// against the spin budget of ranks sharing a GPU.
//
// The zero Split is the default: DefaultSplit of the grid. The Buffer
// (package buffer) reads its split from $GOEP_INTERNODE_SPLIT (SplitEnv,
// ParseSplit's forms).
type Split struct {
	Senders, Forwarders, Receivers int
	Shared                         bool
}

// PutBytesEnv names the environment variable the Buffer reads
// NotifyConfig.PutBytes from (ParsePutBytes's forms).
const PutBytesEnv = "GOEP_INTERNODE_PUT_BYTES"

// MaxPutBytes bounds NotifyConfig.PutBytes (the kernels hold it in 32
// bits).
const MaxPutBytes = 1 << 30

// DefaultPutBytes is the put size the Buffer asks for when
// $GOEP_INTERNODE_PUT_BYTES is unset. Measured (docs/PERFORMANCE.md,
// session 11; 4x H200, 2 virtual nodes over TCP, 4096 tokens): pieces of
// 1 MiB took 0.4-0.8 ms off cached dispatch and combine against one put
// per block (the first piece leaves while the block writes the rest); 2
// MiB gained less, 512 KiB and 256 KiB lost 2-4 ms (a put's fixed cost on
// the proxy and the sockets).
const DefaultPutBytes = 1 << 20

// PortSMs is the dispatch and combine grid the Buffer asks for over the
// port over CUDA IPC when its caller names none (DefaultSMsOver). Measured
// (docs/PERFORMANCE.md, session 20; EP2 on 2 H200s, two passes): 24 blocks
// against DefaultSMs' 16 took the combine at 4096 tokens 626-630 -> 471-473
// us and left the dispatch where it was (437-438 against 439-440 us; at
// 1024 tokens 177-193 against 179-208). The same grid as DeepEP's own
// tests and intranode.DefaultSMs.
const PortSMs = 24

// DefaultSMsOver is the dispatch and combine grid the Buffer asks for over
// network transport t when its caller names none (NotifyConfig.DefaultSMs,
// still capped by the device's SMs and the spin budget): PortSMs over the
// port over CUDA IPC, DefaultSMs elsewhere (over TCP the sockets pace the
// call, and the model keeps the SMs).
func DefaultSMsOver(t channels.Transport) int {
	if t == channels.TransportCudaIPC {
		return PortSMs
	}
	return DefaultSMs
}

// DefaultPutBytesOver is the put size the Buffer asks for over network
// transport t, whose line rate is emulated at emulatedGBps (0: not;
// channels.NetworkConfig.EmulatedGBps), when $GOEP_INTERNODE_PUT_BYTES is
// unset: DefaultPutBytes, except over the port over CUDA IPC at the copy
// engines' own speed, where it is 0, one put per node and block (grouped:
// DefaultPutGroupsOver). There the proxy issues each put as a copy on one
// stream at a fixed cost, and with the senders' copies shortened (session
// 18) the copies paced the call: EP2 on 2 H100s at 4096 tokens, one put per
// block (and 4 MiB pieces) took dispatch 568 -> 531-538 us and combine
// 722-742 -> 641-661 us against 1 MiB pieces; at 1024 tokens the same
// within the spread (PERFORMANCE.md, session 18). Over a link slower than
// the copies around it (TCP, a NIC, the port at an emulated rate) the
// first piece should leave as soon as it is packed: EP2 on 2 H200s at 4096
// tokens over the port paced at 50 GB/s (a 400 Gb/s NIC), 1 MiB pieces
// took dispatch / combine 1354 / 1389 us (4 put groups) to 1303 / 1327
// (net/put once 87% / 84% -> 90% / 88%; session 23).
func DefaultPutBytesOver(t channels.Transport, emulatedGBps float64) int {
	if t == channels.TransportCudaIPC && emulatedGBps == 0 {
		return 0
	}
	return DefaultPutBytes
}

// Forward says when the dispatch kernel's forwarders start on the relay
// rows from another node (NotifyConfig.Forward).
type Forward int

const (
	// ForwardNodes: once all of a source node's rows landed. The last of
	// the source's sender blocks adds one counter per node after every
	// block's puts: one atomic add per node and call.
	ForwardNodes Forward = iota
	// ForwardBlocks: each sender block's rows as soon as they landed.
	// Every sender block stores a word per node after its last put there,
	// naming its run of rows; forwarder blocks claim runs of rows of any
	// landed unit (an atomic counter per unit), so the NVLink leg of the
	// first blocks' rows runs while later blocks' rows are still on the
	// network, and the last unit's rows are spread over every forwarder
	// block. One store per node and sender block (a port channel
	// word store: a stream write over CUDA IPC and TCP, where an atomic
	// add is a kernel launch).
	ForwardBlocks
	// ForwardAuto: ForwardBlocks where a source's rows at a node come to
	// forwardAutoBytes or more, ForwardNodes below (the sender and the
	// forwarder decide from the same count, per call and node).
	ForwardAuto
)

// forwardAutoBytes is where ForwardAuto switches to forwarding by block:
// relay rows of one source at one node, in bytes. Measured (EP2 over the
// port on 2 H200s, session 19, PERFORMANCE.md): by block took 4096-token
// dispatch (58 MB a node) from 502-507 to 485-487 us, but 1024 tokens
// (15 MB) from 183-191 to 222-224 us. A variable for tests.
var forwardAutoBytes = 32 << 20

func (f Forward) String() string {
	switch f {
	case ForwardNodes:
		return "nodes"
	case ForwardBlocks:
		return "blocks"
	case ForwardAuto:
		return "auto"
	}
	return fmt.Sprintf("Forward(%d)", int(f))
}

// ForwardEnv names the environment variable the Buffer reads
// NotifyConfig.Forward from (ParseForward's forms).
const ForwardEnv = "GOEP_INTERNODE_FORWARD"

// ParseForward reads a NotifyConfig.Forward: "nodes", "blocks" or "auto";
// "" gives def (the Buffer's: DefaultForwardOver its transport).
func ParseForward(v string, def Forward) (Forward, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "":
		return def, nil
	case "nodes", "node":
		return ForwardNodes, nil
	case "blocks", "block":
		return ForwardBlocks, nil
	case "auto":
		return ForwardAuto, nil
	}
	return 0, fmt.Errorf("forward %q: want nodes, blocks or auto", v)
}

// DefaultForwardOver is the forwarding the Buffer asks for over network
// transport t when $GOEP_INTERNODE_FORWARD is unset: ForwardAuto over the
// port over CUDA IPC, where the rows land in a few hundred microseconds
// and forwarding them only after the last one was the tail of a large
// call (session 18's kernel trace); ForwardNodes over TCP, where the
// words cost more than they save (session 19: 128-token dispatch 550-578
// against 662-706 us by block; 4096 tokens within the hosts' spread).
func DefaultForwardOver(t channels.Transport) Forward {
	if t == channels.TransportCudaIPC {
		return ForwardAuto
	}
	return ForwardNodes
}

// ParsePutBytes reads a NotifyConfig.PutBytes: "" (DefaultPutBytes), "0"
// (one put per node and block), or a byte count with an optional k or m
// suffix (KiB, MiB), e.g. "1m" or "262144", at most MaxPutBytes.
func ParsePutBytes(v string) (int, error) {
	in := v
	v = strings.ToLower(strings.TrimSpace(v))
	if v == "" {
		return DefaultPutBytes, nil
	}
	mult := 1
	switch {
	case strings.HasSuffix(v, "k"):
		mult, v = 1<<10, strings.TrimSuffix(v, "k")
	case strings.HasSuffix(v, "m"):
		mult, v = 1<<20, strings.TrimSuffix(v, "m")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > MaxPutBytes/mult {
		return 0, fmt.Errorf("put bytes %q: want a byte count in 0..%d, optionally with a k or m suffix", in, MaxPutBytes)
	}
	return n * mult, nil
}

// PutGroupsEnv names the environment variable the Buffer reads
// NotifyConfig.PutGroups from (ParsePutGroups).
const PutGroupsEnv = "GOEP_INTERNODE_PUT_GROUPS"

// MaxPutGroups bounds NotifyConfig.PutGroups (a launch's blocks).
const MaxPutGroups = maxBlocks

// PortPutGroups is NotifyConfig.PutGroups over the port over CUDA IPC
// where $GOEP_INTERNODE_PUT_GROUPS is unset (DefaultPutGroupsOver). Each
// put there is a copy that costs the copy engine about 3 us beside its
// bytes on any stream (TestCopyEngineLab: one put of an EP2 dispatch's
// 58.5 MB 164 us, the same bytes in 16 puts 216 us, in 64 puts 300 us;
// copies spread over 2 to 8 streams no faster), while too few puts start
// the copies late. Measured (docs/PERFORMANCE.md, session 21; EP2 on 2
// H200s, 4096 tokens, dispatch us), 24 blocks: a put per block 431-439,
// 12 puts 375, 8 353, 6 339-344, 4 340-345, 2 357, 1 403; 48 blocks: 8
// puts 318-319, 4 299-300; 64 blocks in 4 puts 289; 32 blocks in 4 puts
// 318 (in 6: 324-327). The combine's puts start after its reduce: at 24
// blocks within the spread at 4096 tokens (464-476 against 473-480 us)
// and -18% at 1024; 48 blocks in 4 puts 364-377 against 494 a put per
// block.
const PortPutGroups = 4

// DefaultPutGroupsOver is NotifyConfig.PutGroups where
// $GOEP_INTERNODE_PUT_GROUPS is unset: PortPutGroups over the port over
// CUDA IPC, 0 (a put per block) elsewhere (TCP cuts puts in pieces, which
// groups do not apply to).
func DefaultPutGroupsOver(t channels.Transport) int {
	if t == channels.TransportCudaIPC {
		return PortPutGroups
	}
	return 0
}

// ParsePutGroups reads a NotifyConfig.PutGroups: "" (def), or a put count
// in 0..MaxPutGroups (0: a put per block).
func ParsePutGroups(v string, def int) (int, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > MaxPutGroups {
		return 0, fmt.Errorf("put groups %q: want a put count in 0..%d (0: a put per block)", v, MaxPutGroups)
	}
	return n, nil
}

// ReduceSMsEnv names the environment variable the Buffer reads
// NotifyConfig.ReduceSMs from (ParseReduceSMs).
const ReduceSMsEnv = "GOEP_INTERNODE_REDUCE_SMS"

// MaxReduceSMs bounds NotifyConfig.ReduceSMs (a grid's blocks; far above
// any GPU's SMs).
const MaxReduceSMs = 4096

// ParseReduceSMs reads a NotifyConfig.ReduceSMs: "" or "0" (every SM of
// the device), "-1" or "off" (the final reduce inside the combine kernel),
// or a block count in 1..MaxReduceSMs.
func ParseReduceSMs(v string) (int, error) {
	in := v
	v = strings.ToLower(strings.TrimSpace(v))
	switch v {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < -1 || n > MaxReduceSMs {
		return 0, fmt.Errorf("reduce SMs %q: want -1 or off (inside the combine kernel), 0 (every SM) or a block count up to %d", in, MaxReduceSMs)
	}
	return n, nil
}

// ReduceUnitsEnv names the environment variable the Buffer reads
// NotifyConfig.ReduceUnits from (ParseReduceUnits).
const ReduceUnitsEnv = "GOEP_INTERNODE_REDUCE_UNITS"

// ReduceUnits says when the combine's final reduce sums a token
// (NotifyConfig.ReduceUnits).
type ReduceUnits int

const (
	// ReduceAfter: once every node's partials landed, on a grid of its own
	// after the combine kernel (NotifyConfig.ReduceSMs).
	ReduceAfter ReduceUnits = iota
	// ReduceByUnits: as soon as every node's partial of the token is in,
	// inside the combine kernel, while the network still carries the
	// others: each put of partials to another node is followed on its
	// channel by a word naming its rows (a unit), and the source's combine
	// blocks claim the landed units. It removes the final reduce's tail
	// after the last partial (about 80 us at 4096 tokens), but over the
	// port every word is one more driver call of the proxy, which at an
	// emulated 50 GB/s slowed the link by about 10%; the combine's own SMs
	// sum the tokens about 5x slower than every SM after it does, so the
	// units must land through the call, not at its end. Measured slower
	// or level on 2 H200s (session 24, PERFORMANCE.md), so not a default:
	// for links where a word costs next to nothing (an RDMA write).
	ReduceByUnits
)

func (u ReduceUnits) String() string {
	switch u {
	case ReduceAfter:
		return "off"
	case ReduceByUnits:
		return "units"
	}
	return fmt.Sprintf("ReduceUnits(%d)", int(u))
}

// DefaultReduceUnitsOver is NotifyConfig.ReduceUnits where
// $GOEP_INTERNODE_REDUCE_UNITS is unset, over network transport t whose
// line rate is emulated at emulatedGBps (0: not): ReduceAfter on every
// transport and rate measured (ReduceByUnits says why).
func DefaultReduceUnitsOver(t channels.Transport, emulatedGBps float64) ReduceUnits {
	return ReduceAfter
}

// ParseReduceUnits reads a NotifyConfig.ReduceUnits: "" (def), "off" (or
// "0", "false"), "units" (or "on", "1", "true").
func ParseReduceUnits(v string, def ReduceUnits) (ReduceUnits, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "":
		return def, nil
	case "off", "0", "false":
		return ReduceAfter, nil
	case "units", "on", "1", "true":
		return ReduceByUnits, nil
	}
	return ReduceAfter, fmt.Errorf("reduce units %q: want off or units", v)
}

// combUnitsPerBlock makes the combine's units a forwarder block's whole
// run of rows to a node (one word after its last put there) instead of
// each put: what the kernel falls back to when a forwarder's puts to a
// node would be more than its unit table holds. Measured (EP2, 2 H200s,
// 50 GB/s, 4096 tokens): the units then land in the link's last third and
// the combine's SMs sum most tokens after it, 1780 us against 1319-1365
// with ReduceAfter. A variable for tests (the fallback's path).
var combUnitsPerBlock = false

// ProxyPendingEnv names the environment variable the Buffer reads
// NotifyConfig.ProxyMaxPending from (ParseProxyPending).
const ProxyPendingEnv = "GOEP_INTERNODE_PROXY_PENDING"

// MaxProxyPending bounds NotifyConfig.ProxyMaxPending.
const MaxProxyPending = 1 << 20

// ParseProxyPending reads a NotifyConfig.ProxyMaxPending: "" or "0"
// (channels' default), or a count in 1..MaxProxyPending.
func ParseProxyPending(v string) (int, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > MaxProxyPending {
		return 0, fmt.Errorf("proxy max pending %q: want a count in 0..%d", v, MaxProxyPending)
	}
	return n, nil
}

// SplitEnv names the environment variable the Buffer reads its split
// from (ParseSplit's forms: "S,F,R", "shared", "default" or unset).
const SplitEnv = "GOEP_INTERNODE_SPLIT"

// SharedSplitTokens is where the default split turns Shared: a launch of
// this many tokens or more on its rank runs every block in every role when
// no split is configured (NotifyConfig.Split, SetSplit, $GOEP_INTERNODE_SPLIT).
// From the sweeps of docs/PERFORMANCE.md (4 ranks in 2 virtual nodes over
// TCP, 16 blocks): in session 8 (2 sockets, before the parallel socket
// reads) 4,8,4 was the best of seven splits at 128 tokens and Shared the
// worst (36% slower); in session 9 (4 sockets) Shared was the best at 256,
// 512, 1024 and 2048 tokens, 14-26% faster than the best role split
// (dispatch + combine at 256: 2.96 ms vs 3.44 ms for 4,8,4). Many rows keep
// every block busy in every role; few rows leave role blocks idle less
// often than shared blocks serialise their roles. Session 17 measured it
// again (4x H100, EP4): the sweeps leaned to 4,8,4 up to 2048 tokens, but
// an alternated A/B against the default did not separate them (the default
// ahead at 1024), so the threshold stays. Ranks need not agree on a
// split (each rank's roles are its own), so the choice follows this rank's
// own token count.
const SharedSplitTokens = 256

// DefaultSplit is the split of a grid of blocks when none is given: a
// quarter senders, a quarter receivers (at least one each), the rest
// forwarders (the NVLink leg writes each row to up to eight ranks); grids
// under four blocks are Shared.
func DefaultSplit(blocks int) Split {
	if blocks < 4 {
		return Split{Shared: true}
	}
	s, r := max(1, blocks/4), max(1, blocks/4)
	return Split{Senders: s, Forwarders: blocks - s - r, Receivers: r}
}

// launchSplit is the split a launch of tokens tokens on this rank runs:
// resolved (the configured split on the grid in use), or, with none
// configured (configured is the zero Split), Shared from SharedSplitTokens
// tokens on.
func launchSplit(configured, resolved Split, tokens int) Split {
	if configured == (Split{}) && tokens >= SharedSplitTokens {
		return Split{Shared: true}
	}
	return resolved
}

// Total is the blocks a split names (0 for the default and Shared).
func (sp Split) Total() int {
	if sp.Shared {
		return 0
	}
	return sp.Senders + sp.Forwarders + sp.Receivers
}

// Validate says whether sp is the default, Shared (with no counts) or
// three counts >= 1.
func (sp Split) Validate() error {
	counts := sp.Senders != 0 || sp.Forwarders != 0 || sp.Receivers != 0
	switch {
	case sp.Shared && counts:
		return fmt.Errorf("split %+v: Shared takes no counts", sp)
	case counts && (sp.Senders < 1 || sp.Forwarders < 1 || sp.Receivers < 1):
		return fmt.Errorf("split %d,%d,%d: want at least one sender, forwarder and receiver block", sp.Senders, sp.Forwarders, sp.Receivers)
	case counts && (sp.Senders > maxBlocks || sp.Forwarders > maxBlocks || sp.Receivers > maxBlocks ||
		sp.Senders+sp.Forwarders+sp.Receivers > maxBlocks):
		return fmt.Errorf("split %d,%d,%d: more than %d blocks", sp.Senders, sp.Forwarders, sp.Receivers, maxBlocks)
	}
	return nil
}

// resolve is the split launched on a grid of blocks (sp valid: a split
// with counts has their total).
func (sp Split) resolve(blocks int) Split {
	if sp.Shared || sp.Total() > 0 {
		return sp
	}
	return DefaultSplit(blocks)
}

// String is "shared", "default" or "S,F,R" (ParseSplit's forms).
func (sp Split) String() string {
	switch {
	case sp.Shared:
		return "shared"
	case sp.Total() == 0:
		return "default"
	}
	return fmt.Sprintf("%d,%d,%d", sp.Senders, sp.Forwarders, sp.Receivers)
}

// ParseSplit reads "S,F,R" (blocks of senders, forwarders, receivers),
// "shared" or "default" ("" too).
func ParseSplit(v string) (Split, error) {
	switch v = strings.TrimSpace(v); v {
	case "", "default":
		return Split{}, nil
	case "shared":
		return Split{Shared: true}, nil
	}
	f := strings.Split(v, ",")
	if len(f) != 3 {
		return Split{}, fmt.Errorf("internode: split %q: want S,F,R, shared or default", v)
	}
	var n [3]int
	for j, x := range f {
		var err error
		if n[j], err = strconv.Atoi(strings.TrimSpace(x)); err != nil {
			return Split{}, fmt.Errorf("internode: split %q: %w", v, err)
		}
	}
	sp := Split{Senders: n[0], Forwarders: n[1], Receivers: n[2]}
	if err := sp.Validate(); err != nil {
		return Split{}, fmt.Errorf("internode: %w", err)
	}
	return sp, nil
}
