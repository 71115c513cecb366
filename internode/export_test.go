package internode

import (
	"encoding/binary"
	"fmt"

	"github.com/goep-dev/goep/internal/device"
)

// SetForwardAutoBytes sets where ForwardAuto forwards by block for Notifys
// made after it, and returns the previous value.
func SetForwardAutoBytes(n int) int {
	prev := forwardAutoBytes
	forwardAutoBytes = n
	return prev
}

// SetCombUnitsPerBlock makes ReduceByUnits name a forwarder block's whole
// run a unit (the kernel's fallback) for Notifys made after it, and
// returns the previous value.
func SetCombUnitsPerBlock(on bool) bool {
	prev := combUnitsPerBlock
	combUnitsPerBlock = on
	return prev
}

// LaunchSplitFor is launchSplit: the split a launch runs.
var LaunchSplitFor = launchSplit

// SetDeviceTestHook wraps the device of every Notify made after it (nil
// removes it).
func SetDeviceTestHook(h func(device.Device) device.Device) { deviceTestHook = h }

// SetNotifyTestHook installs the notify twin's hook between waits and
// reads (nil removes it); stages are NotifyStageNet and NotifyStageNVL.
func SetNotifyTestHook(h func(rank int, round uint64, stage int)) { notifyTestHook = h }

const (
	NotifyStageNet = stageNotifyNet
	NotifyStageNVL = stageNotifyNVL
)

// DebugCounters reads this rank's protocol counters (a diagnostic for a
// test that timed out: which arrivals landed, against the round each step
// waits for). It copies device memory synchronously: call it only when no
// kernel of this rank runs.
func (nt *Notify) DebugCounters() (string, error) {
	if nt == nil || nt.dev == nil || nt.rdma.Ptr == 0 || nt.nvl.Ptr == 0 {
		return "", fmt.Errorf("internode: debug counters: no notify set up (nil, or closed)")
	}
	s, dl := nt.shape, nt.dl
	n, p := s.Nodes, s.RanksPerNode
	read := func(base uintptr, off, words int) ([]uint64, error) {
		b := make([]byte, 8*words)
		if err := nt.dev.CopyOut(b, base+uintptr(off)); err != nil {
			return nil, err
		}
		v := make([]uint64, words)
		for j := range v {
			v[j] = binary.LittleEndian.Uint64(b[8*j:])
		}
		return v, nil
	}
	type part struct {
		name  string
		base  uintptr
		off   int
		words int
		want  uint64
	}
	parts := []part{
		{"notify net [node]", nt.rdma.Ptr, 0, n, nt.round},
		{"notify nvl [forwarder]", nt.nvl.Ptr, 0, p, nt.round},
		{"dispatch net [node]", nt.rdma.Ptr, dl.netCounters, n, nt.dispRound},
		{"dispatch ready (own)", nt.nvl.Ptr, dl.ready, 1, nt.dispRound},
		{"dispatch nvl [forwarder]", nt.nvl.Ptr, dl.nvlCounters, p, nt.dispRound},
		{"combine ready (own)", nt.nvl.Ptr, dl.combReady, 1, nt.combRound},
		{"combine net [node]", nt.rdma.Ptr, dl.combCounters, n, nt.combRound},
	}
	if nt.kern != nil {
		// The dispatch kernel's forwarders add each NVLink counter twice a
		// round (own node's rows, then the others').
		parts[4].want = 2 * nt.dispRound
		// The kernels' step counters (the own node's network entry stays
		// 0), and the device epochs (notify, dispatch, combine rounds and
		// steps finished) against the host's counts (equal unless graphs
		// replayed launches).
		parts = append(parts, part{"steps done net [node]", nt.rdma.Ptr, dl.doneNet, n, nt.steps},
			part{"steps done nvl [local]", nt.nvl.Ptr, dl.doneNVL, p, nt.steps})
	}
	out := fmt.Sprintf("rank %d (node %d, local %d):", nt.rank, s.Node(nt.rank), s.Local(nt.rank))
	for _, pt := range parts {
		v, err := read(pt.base, pt.off, pt.words)
		if err != nil {
			return out, fmt.Errorf("internode: rank %d: counters %s: %w", nt.rank, pt.name, err)
		}
		out += fmt.Sprintf(" %s %v want %d;", pt.name, v, pt.want)
	}
	if nt.kern != nil {
		v, err := read(nt.kern.epochs, 0, epochWords)
		if err != nil {
			return out, fmt.Errorf("internode: rank %d: device epochs: %w", nt.rank, err)
		}
		out += fmt.Sprintf(" device epochs [notify dispatch combine steps] %v host %v;", v,
			[]uint64{nt.round, nt.dispRound, nt.combRound, nt.steps})
	}
	return out, nil
}
