package channels

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/goep-dev/goep/internal/device"
)

// Placement says where a communicator's ranks run relative to this rank:
// which ranks share its GPU, and so how many blocks a kernel of this rank
// that spins on its peers may use.
//
// Ranks may share a GPU when they are goroutines of one process (they share
// the GPU's primary context and reach each other's memory directly). Kernels
// that wait on each other must then all be resident at once: a block that
// spins while the block it waits for cannot be scheduled never ends. goep
// keeps every rank on a GPU within SpinBlocks blocks per spinning launch,
// which guarantees co-residency whatever the kernels' sizes (see
// SpinBudget). Processes sharing a GPU are refused: without MPS their
// kernels time-slice, so a spinning kernel runs while the one it waits for
// cannot.
type Placement struct {
	// SharedGPU lists the ranks (this one included, ascending) whose
	// device is this rank's GPU; just this rank on the host backend.
	SharedGPU []int
	// SMs is this rank's GPU's multiprocessor count (0 on the host
	// backend).
	SMs int
	// AnyShared reports whether some GPU of the group runs several ranks
	// (libraries that refuse that, NCCL among them, cannot serve it).
	AnyShared bool
	// SpinBlocks is the most blocks one launch of any rank of the group
	// may use when it waits on other ranks (0: no limit, the host
	// backend): the smallest SpinBudget over the group's GPUs, the same on
	// every rank, so that protocols whose ranks must agree on a grid do.
	SpinBlocks int
}

// SpinBudget is the blocks a spinning launch of each of shared ranks on a
// GPU of sms multiprocessors may use: the SMs split evenly, less one per
// rank kept for the kernels a spinning kernel may wait for without
// spinning itself (a port channel proxy's atomic-add kernel, staging
// copies). When every rank stays within it, the blocks alive on the GPU are
// fewer than its SMs, so a block waiting to start always finds an empty SM,
// whatever the registers, threads and shared memory of the kernels.
func SpinBudget(sms, shared int) int {
	if sms <= 0 || shared <= 0 {
		return 0
	}
	return max(1, sms/shared-1)
}

// placeInfo is what each rank tells the others about its device.
type placeInfo struct {
	host [16]byte
	pid  uint32
	sms  uint32
	bus  string
}

func (p placeInfo) gpu() string { return string(p.host[:]) + "/" + strings.ToLower(p.bus) }

func (p placeInfo) marshal() []byte {
	b := make([]byte, 0, 24+len(p.bus))
	b = append(b, p.host[:]...)
	b = binary.LittleEndian.AppendUint32(b, p.pid)
	b = binary.LittleEndian.AppendUint32(b, p.sms)
	return append(b, p.bus...)
}

func unmarshalPlaceInfo(b []byte) (placeInfo, error) {
	if len(b) < 24 {
		return placeInfo{}, fmt.Errorf("placement message of %d bytes", len(b))
	}
	var p placeInfo
	copy(p.host[:], b[:16])
	p.pid = binary.LittleEndian.Uint32(b[16:20])
	p.sms = binary.LittleEndian.Uint32(b[20:24])
	p.bus = string(b[24:])
	return p, nil
}

// Placement exchanges where every rank runs (collective on the first call
// of every rank; later calls return the same result). It fails when ranks
// of different processes share a GPU, naming them.
func (c *Communicator) Placement(ctx context.Context) (Placement, error) {
	if c == nil {
		var r0 Placement
		return r0, ErrNil
	}
	c.placeMu.Lock()
	defer c.placeMu.Unlock()
	if c.placement != nil {
		return *c.placement, nil
	}
	if err := c.usable(); err != nil {
		return Placement{}, err
	}
	info := c.dev.Info()
	mine := placeInfo{host: c.hostID, pid: uint32(os.Getpid()), sms: uint32(max(info.SMs, 0)), bus: info.PCIBusID}
	pl := Placement{SharedGPU: []int{c.rank}}
	if info.Kind != device.CUDA || mine.bus == "" {
		c.placement = &pl
		return pl, nil
	}
	var peers []int
	for p := 0; p < c.size; p++ {
		if p != c.rank {
			peers = append(peers, p)
		}
	}
	msg := mine.marshal()
	theirs, err := c.exchange(ctx, kindPlacement, 0, peers, func(int) []byte { return msg })
	if err != nil {
		return Placement{}, err
	}
	all := make([]placeInfo, c.size)
	all[c.rank] = mine
	for i, m := range theirs {
		if all[peers[i]], err = unmarshalPlaceInfo(m); err != nil {
			return Placement{}, c.errorf("placement from rank %d: %w", peers[i], err)
		}
	}
	// Ranks per GPU over the whole group; processes sharing one refused.
	perGPU := map[string][]int{}
	for r, p := range all {
		perGPU[p.gpu()] = append(perGPU[p.gpu()], r)
	}
	var clash []string
	for _, ranks := range perGPU {
		first := all[ranks[0]]
		for _, r := range ranks[1:] {
			if all[r].pid != first.pid {
				clash = append(clash, fmt.Sprintf("ranks %d (process %d) and %d (process %d) share GPU %s",
					ranks[0], first.pid, r, all[r].pid, first.bus))
				break
			}
		}
	}
	if len(clash) > 0 {
		sort.Strings(clash)
		return Placement{}, c.errorf("%s: processes sharing a GPU time-slice, so kernels that wait on each other would crawl "+
			"or stall. Run ranks that share a GPU as goroutines of one process (ep-bench --ranks N, or one Bootstrap per "+
			"goroutine from bootstrap.NewInProcess), or give each process its own GPU", strings.Join(clash, "; "))
	}
	pl.SharedGPU = perGPU[mine.gpu()]
	sort.Ints(pl.SharedGPU)
	pl.SMs = info.SMs
	for _, ranks := range perGPU {
		pl.AnyShared = pl.AnyShared || len(ranks) > 1
		b := SpinBudget(int(all[ranks[0]].sms), len(ranks))
		if b > 0 && (pl.SpinBlocks == 0 || b < pl.SpinBlocks) {
			pl.SpinBlocks = b
		}
	}
	// Ranks sharing this GPU: the one stream of this rank's connections
	// (connStream) is made now, while no kernel spins, not by the proxy at
	// its first copy: a new stream's first launch can be held behind the
	// kernels already running (ARCHITECTURE.md, "Ranks sharing a GPU").
	if len(pl.SharedGPU) > 1 {
		c.sharedConnMu.Lock()
		if c.sharedConnStream == nil {
			c.sharedConnStream, err = c.dev.NewStream()
		}
		c.sharedConnMu.Unlock()
		if err != nil {
			return Placement{}, c.errorf("placement: connection stream: %w", err)
		}
	}
	c.placement = &pl
	return pl, nil
}

// CheckSpinLaunch refuses a launch of blocks blocks that spins on other
// ranks when it would exceed this rank's share of its GPU (Placement must
// have run; a communicator without one has no limit).
func (c *Communicator) CheckSpinLaunch(what string, blocks int) error {
	if c == nil {
		return ErrNil
	}
	c.placeMu.Lock()
	pl := c.placement
	c.placeMu.Unlock()
	if pl == nil || pl.SpinBlocks == 0 || blocks <= pl.SpinBlocks {
		return nil
	}
	return c.errorf("%s: %d blocks, but ranks share GPUs (%d on this rank's GPU %s of %d SMs): every kernel that waits on "+
		"other ranks must be resident at once, so a launch may use at most %d blocks (SMs / ranks - 1)", what, blocks,
		len(pl.SharedGPU), c.dev.Info().PCIBusID, pl.SMs, pl.SpinBlocks)
}
