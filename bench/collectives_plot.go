package bench

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotColl draws bus bandwidth against bytes per rank, one line per
// collective and implementation (ours: the fastest native or selector's
// choice; NCCL), from the flushed and eager rows.
func plotColl(prefix string, rep collReport) error {
	type series struct {
		label string
		pts   plotter.XYs
	}
	var order []string
	byLabel := map[string]*series{}
	add := func(label string, x, y float64) {
		s := byLabel[label]
		if s == nil {
			s = &series{label: label}
			byLabel[label] = s
			order = append(order, label)
		}
		s.pts = append(s.pts, plotter.XY{X: x, Y: y})
	}
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
	if len(order) == 0 {
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
	sort.Strings(order)
	for i, label := range order {
		s := byLabel[label]
		sort.Slice(s.pts, func(a, b int) bool { return s.pts[a].X < s.pts[b].X })
		line, points, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(label, line, points)
	}
	for _, ext := range []string{"png", "svg"} {
		if err := p.Save(10*vg.Inch, 6*vg.Inch, prefix+"."+ext); err != nil {
			return err
		}
	}
	return nil
}
