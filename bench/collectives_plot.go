package bench

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
)

// plotColl draws bus bandwidth against bytes per rank, one line per
// collective and implementation (ours: the fastest native or selector's
// choice; NCCL), from the flushed and eager rows.
func plotColl(prefix string, rep collReport) error {
	var ls lineSet
	add := ls.add
	if len(rep.Compare) > 0 {
		for _, c := range rep.Compare {
			if c.Mode == "graph" {
				continue
			}
			add(c.Collective+" goep", float64(c.Bytes), c.OursBus)
			add(c.Collective+" NCCL", float64(c.Bytes), c.NCCLBus)
		}
	} else {
		best := map[string]float64{}
		for _, r := range rep.Rows {
			if r.Mode == "graph" || r.BusGBps <= 0 {
				continue
			}
			k := fmt.Sprintf("%s|%d", r.Collective, r.Bytes)
			best[k] = max(best[k], r.BusGBps)
		}
		for k, v := range best {
			coll, b, _ := strings.Cut(k, "|")
			x, _ := strconv.ParseFloat(b, 64)
			add(coll+" goep", x, v)
		}
	}
	if len(ls.order) == 0 {
		return errors.New("nothing to plot")
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("goep collectives, %d ranks, %s, %s %s", rep.Ranks, rep.Device, rep.DType, rep.Op)
	p.X.Label.Text = "bytes per rank"
	p.Y.Label.Text = "bus bandwidth GB/s (slowest rank)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	sort.Strings(ls.order)
	if err := ls.draw(p, false); err != nil {
		return err
	}
	return savePlot(p, prefix)
}
