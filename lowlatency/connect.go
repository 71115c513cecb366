package lowlatency

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/device"
)

// Connection is what Connect built for one rank's workspace: the peer
// table and, when the group spans nodes, a proxy serving port channels to
// the ranks of the other nodes. Close frees it; the communicator must
// outlive it.
type Connection struct {
	dev   device.Device
	table device.Buffer
	ports *channels.DeviceArray
	proxy *channels.Proxy
	// comm and mine: the workspace's registration, which Withdraw takes
	// back from the network transport before the caller frees ws.
	comm *channels.Communicator
	mine channels.RegisteredMemory
}

// Connect joins this rank's workspace ws (at least l.Size bytes, control
// block zeroed) to its peers over comm, collectively: it opens the
// workspaces of the ranks on this rank's node (they must be mapped:
// NVLink or peer access, or host memory), uploads the peer table, and
// when l spans nodes registers ws with a proxy and builds a port channel
// to every rank of the other nodes, whose default memories are the two
// workspaces, so that kernels put rows and add to counters at the same
// offsets. The communicator's nodes (hosts, or its virtual nodes) must be
// l's split: nodes of consecutive ranks, l.RanksPerNode() each. tag and
// tag+1 pair the exchanges. The returned Workspace has its Watchdog from
// comm; the caller sets WaitID and SpinBlocks.
func Connect(ctx context.Context, comm *channels.Communicator, ws device.Buffer, l Layout, tag int) (_ *Connection, _ Workspace, err error) {
	if comm == nil {
		return nil, Workspace{}, errors.New("lowlatency: connect: no communicator")
	}
	rank, ranks := comm.Rank(), comm.Size()
	fail := func(format string, a ...any) error {
		return fmt.Errorf("lowlatency: rank %d: connect: "+format, append([]any{rank}, a...)...)
	}
	if l.Size == 0 {
		return nil, Workspace{}, fail("the layout is empty (use NewLayout)")
	}
	if ranks != l.Ranks {
		return nil, Workspace{}, fail("%d ranks in the communicator, %d in the layout", ranks, l.Ranks)
	}
	if ws.Size < l.Size {
		return nil, Workspace{}, fail("workspace of %d bytes, the layout needs %d", ws.Size, l.Size)
	}
	ct, err := comm.Topology(ctx)
	if err != nil {
		return nil, Workspace{}, fail("%w", err)
	}
	per := l.RanksPerNode()
	for r, n := range ct.NodeOf {
		if n != r/per || len(ct.NodeOf) != ranks {
			return nil, Workspace{}, fail("the communicator puts rank %d on node %d; the layout (%d nodes of %d ranks) on node %d",
				r, n, l.NodeCount(), per, r/per)
		}
	}
	dev := comm.Device()
	c := &Connection{dev: dev, comm: comm}
	defer func() {
		if err != nil {
			err = errors.Join(fail("%w", err), c.Close())
			c = nil
		}
	}()
	mine, err := comm.RegisterMemory(ws)
	if err != nil {
		return nil, Workspace{}, err
	}
	c.mine = mine
	var local, remote []int
	nodeMask := l.NodeMask(rank)
	for p := 0; p < ranks; p++ {
		switch {
		case p == rank:
		case nodeMask>>uint(p)&1 != 0:
			local = append(local, p)
		default:
			remote = append(remote, p)
		}
	}
	tab := make([]byte, 8*ranks)
	binary.LittleEndian.PutUint64(tab[8*rank:], uint64(ws.Ptr))
	if len(local) > 0 {
		theirs, err := comm.ExchangeMemory(ctx, mine, local, tag)
		if err != nil {
			return nil, Workspace{}, fmt.Errorf("exchange workspaces: %w", err)
		}
		for i, p := range local {
			switch {
			case !theirs[i].Mapped():
				return nil, Workspace{}, fmt.Errorf("rank %d's workspace is not mapped here: ranks of one node must share memory", p)
			case theirs[i].Size() < l.Size:
				return nil, Workspace{}, fmt.Errorf("rank %d's workspace has %d bytes; the layout needs %d", p, theirs[i].Size(), l.Size)
			}
			binary.LittleEndian.PutUint64(tab[8*p:], uint64(theirs[i].Ptr()))
		}
	}
	if c.table, err = dev.Alloc(len(tab)); err != nil {
		return nil, Workspace{}, fmt.Errorf("peer table: %w", err)
	}
	if err := dev.CopyIn(c.table.Ptr, tab); err != nil {
		return nil, Workspace{}, fmt.Errorf("peer table: %w", err)
	}
	w := Workspace{Layout: l, Rank: rank, Base: ws.Ptr, Size: ws.Size, Peers: c.table.Ptr, Watchdog: comm.Watchdog()}
	if len(remote) > 0 {
		if c.proxy, err = comm.NewProxy(channels.ProxyConfig{}); err != nil {
			return nil, Workspace{}, err
		}
		mesh, err := c.proxy.NewPortChannelMesh(ctx, channels.PortMeshConfig{Tag: tag + 1, Peers: remote, Local: mine})
		if err != nil {
			return nil, Workspace{}, fmt.Errorf("port channels to the other nodes: %w", err)
		}
		for i, p := range remote {
			if mesh.Remote[i].Size() < l.Size {
				return nil, Workspace{}, fmt.Errorf("rank %d's workspace has %d bytes; the layout needs %d", p, mesh.Remote[i].Size(), l.Size)
			}
		}
		if c.ports, err = comm.UploadPortChannels(mesh.ByRank(ranks)); err != nil {
			return nil, Workspace{}, err
		}
		if err := c.proxy.Start(); err != nil {
			return nil, Workspace{}, err
		}
		w.Ports = c.ports.Ptr()
	}
	return c, w, nil
}

// Close stops the proxy (draining what kernels pushed: it returns once the
// receivers acknowledged this rank's puts and adds) and frees the tables.
// Callers synchronise their streams first; after every rank's Close they
// meet (nothing is then in flight toward this rank), Withdraw, and free
// the workspace. Nil-safe and idempotent.
func (c *Connection) Close() error {
	if c == nil {
		return nil
	}
	var errs []error
	if c.proxy != nil {
		errs = append(errs, c.proxy.Close())
		c.proxy = nil
	}
	if c.ports != nil {
		errs = append(errs, c.ports.Close())
		c.ports = nil
	}
	if c.table.Ptr != 0 {
		errs = append(errs, c.dev.Free(c.table))
		c.table = device.Buffer{}
	}
	return errors.Join(errs...)
}

// Withdraw takes the workspace back from the network transport
// (channels.Communicator.DeregisterMemory): a peer's put or add that still
// arrives is then refused, an error naming the memory, instead of landing
// in the freed workspace. Call it after Close and the meeting, before the
// workspace is freed, and before the communicator closes. Nil-safe and
// idempotent.
func (c *Connection) Withdraw() error {
	if c == nil || !c.mine.Valid() {
		return nil
	}
	err := c.comm.DeregisterMemory(c.mine)
	c.mine = channels.RegisteredMemory{}
	if err != nil {
		return fmt.Errorf("lowlatency: withdraw workspace: %w", err)
	}
	return nil
}
