package bench

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/internode"
)

// `ep-bench internode --trace-proxy`: one extra call of cached dispatch,
// combine and the all-ranks port put, each with the channels proxy trace
// on (channels.SetProxyTrace), to show where the network leg's time goes.
// Measurement only: the timed figures are taken with tracing off.

// interTrace is one rank's traced call.
type interTrace struct {
	Label string  `json:"label"`
	Rank  int     `json:"rank"`
	US    float64 `json:"us"` // the call between two events (GPU time)
	// FirstTriggerUS: the proxy's first trigger after the host issued the
	// call (the kernel's start is not known on the host: this includes
	// the launch latency).
	FirstTriggerUS float64 `json:"first_trigger_us"`
	// TailUS: from the last incoming message applied on this rank to the
	// host seeing the call's end event complete.
	TailUS float64 `json:"tail_us"`
	// IssueUS: how long the host's call took to return (its launches
	// queued): a first trigger much later than this is kernel time.
	IssueUS float64 `json:"issue_us"`
	Summary string  `json:"summary"`
}

// traceCall runs call once with the proxy trace on, on every rank at once
// (collective), and summarises this rank's trace over the call.
// kern, when not nil, reads the kernel's phase trace (--trace-kernels)
// after the call; its stamps are added to the summary.
func traceCall(rank int, dev device.Device, st device.Stream, label string, sync func() error, call func() error,
	kern func() (internode.KernelTrace, error)) (tr interTrace, err error) {
	e0, err := dev.NewEvent()
	if err != nil {
		return tr, err
	}
	defer e0.Close()
	e1, err := dev.NewEvent()
	if err != nil {
		return tr, err
	}
	defer e1.Close()
	if err := st.Synchronize(); err != nil {
		return tr, err
	}
	channels.ResetProxyTrace(rank)
	channels.SetProxyTrace(true)
	if err := sync(); err != nil {
		return tr, err
	}
	if err := e0.Record(st); err != nil {
		return tr, err
	}
	issued := channels.TraceNow()
	cerr := call()
	returned := channels.TraceNow()
	if cerr == nil {
		if cerr = e1.Record(st); cerr == nil {
			cerr = e1.Synchronize()
		}
	}
	done := channels.TraceNow()
	// Every rank's call has ended before tracing goes off (process-wide);
	// a rank whose call failed still meets the others here.
	serr := sync()
	channels.SetProxyTrace(false)
	if err := errors.Join(cerr, serr); err != nil {
		return tr, err
	}
	el, err := dev.Elapsed(e0, e1)
	if err != nil {
		return tr, err
	}
	snap := channels.SnapshotProxyTrace(rank)
	s := snap.Summary(issued, done)
	tr = interTrace{Label: label, Rank: rank, US: float64(el) / 1e3, FirstTriggerUS: -1, TailUS: -1, IssueUS: float64(returned-issued) / 1e3,
		Summary: s.String() + "\n" + traceTimeline(snap, issued, done, 16)}
	if kern != nil {
		kt, err := kern()
		if err != nil {
			return tr, err
		}
		// Stamps relative to the kernel's first entry: the GPU timer is
		// not the host's clock (session 12 saw entries "after" the proxy's
		// first trigger when compared with the host's wall clock).
		tr.Summary += "\n" + kt.Summary()
	}
	if s.FirstTrigger >= 0 {
		tr.FirstTriggerUS = float64(s.FirstTrigger) / 1e3
	}
	if s.LastApply >= 0 {
		tr.TailUS = float64(time.Duration(done-issued)-s.LastApply) / 1e3
	}
	return tr, nil
}

// printTraces prints rank 0's traced calls and, per label, the slowest
// rank's when another.
func printTraces(w io.Writer, all [][]interTrace) {
	if len(all) == 0 || len(all[0]) == 0 {
		return
	}
	fmt.Fprintln(w, "PROXY TRACE (one traced call each, after the timings; first trigger is from the host issuing the call, the kernel start is not known on the host; "+
		"tail is from the last incoming message applied on the rank to the host seeing the end event; busy = time any event of the stage ran, par = events at once)")
	for i, t := range all[0] {
		show := []interTrace{t}
		slow := t
		for _, ts := range all[1:] {
			if i < len(ts) && ts[i].Label == t.Label && ts[i].US > slow.US {
				slow = ts[i]
			}
		}
		if slow.Rank != t.Rank {
			show = append(show, slow)
		}
		for _, x := range show {
			fmt.Fprintf(w, "%s rank %d: call %.1f us (events), issue returned +%.1f us, first trigger +%.1f us after issue, tail %.1f us\n  %s\n",
				x.Label, x.Rank, x.US, x.IssueUS, x.FirstTriggerUS, x.TailUS, strings.ReplaceAll(x.Summary, "\n", "\n  "))
		}
	}
}

// traceTimeline cuts [from, to] into bins and prints, per bin, the put
// bytes the proxy took off the FIFO (when the kernel's puts reached the
// transport), the bytes this rank's sockets finished writing, and the
// bytes its receivers finished copying in (MB): where the network leg ran
// at full rate and where it idled.
func traceTimeline(pt *channels.ProxyTrace, from, to int64, bins int) string {
	if pt == nil || to <= from || bins < 1 {
		return ""
	}
	width := (to - from + int64(bins) - 1) / int64(bins)
	rows := [3][]int64{make([]int64, bins), make([]int64, bins), make([]int64, bins)}
	// Per receiving socket, the bytes it finished reading: a socket that
	// lags behind the others holds every later message's apply.
	var perSocket [][]int64
	bin := func(t int64) int {
		return min(bins-1, max(0, int((t-from)/width)))
	}
	for _, e := range pt.Events {
		switch {
		case e.Stage == channels.StageTrigger && (e.Op == channels.OpPut || e.Op == channels.OpPutSignal):
			rows[0][bin(e.Start)] += e.Bytes
		case e.Stage == channels.StageSend:
			rows[1][bin(e.End)] += e.Bytes
		case e.Stage == channels.StageCopyIn:
			rows[2][bin(e.End)] += e.Bytes
		case e.Stage == channels.StageRecv && e.Role == channels.RoleReceiver && e.Socket >= 0 && e.Bytes > 0:
			for int(e.Socket) >= len(perSocket) {
				perSocket = append(perSocket, make([]int64, bins))
			}
			perSocket[e.Socket][bin(e.End)] += e.Bytes
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "timeline, MB per %.0f us bin from the issue:", float64(width)/1e3)
	line := func(name string, row []int64) {
		fmt.Fprintf(&b, "\n    %-12s", name)
		for _, v := range row {
			fmt.Fprintf(&b, " %5.1f", float64(v)/1e6)
		}
	}
	for i, name := range []string{"puts popped", "sent", "copied in"} {
		line(name, rows[i])
	}
	for k, row := range perSocket {
		line(fmt.Sprintf("read sock %d", k), row)
	}
	return b.String()
}

// applyInnTrace turns the internode trace build on for --trace-kernels
// (whatever $GOEP_INN_TRACE says, which is then only checked for a valid
// value), else follows $GOEP_INN_TRACE; before any kernel is compiled. It
// reports whether the build is traced.
func applyInnTrace(flag bool) (bool, error) {
	on, err := kernelflags.InnTraceEnv()
	if err != nil {
		return false, err
	}
	on = on || flag
	if err := kernelflags.SetInnTrace(on); err != nil {
		return false, err
	}
	return on, nil
}

// kernelTrace reads this rank's internode phase trace: the last combine's
// (combine) or dispatch's records.
func (r *inRank) kernelTrace(combine bool) (internode.KernelTrace, error) {
	raw, err := r.buf.InternodeTrace()
	if err != nil {
		return internode.KernelTrace{}, err
	}
	d, c, err := internode.ParseKernelTrace(raw)
	if combine {
		return c, err
	}
	return d, err
}
