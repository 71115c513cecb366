package bench

import (
	"fmt"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotIntranode draws GB/s (rank 0's, DeepEP's accounting) against tokens
// per rank, one line per (op, dtype, mode, launch), and writes
// prefix.png and prefix.svg. It needs at least two token counts.
func plotIntranode(prefix string, rep inReport) error {
	type series struct {
		label string
		pts   plotter.XYs
	}
	var order []string
	byLabel := map[string]*series{}
	tokens := map[int]bool{}
	for _, r := range rep.Rows {
		if r.Bytes == 0 || r.Tokens <= 0 || r.US <= 0 {
			continue
		}
		tokens[r.Tokens] = true
		label := fmt.Sprintf("%s %s %s (%d SMs)", r.Op, r.Dtype, r.Mode, r.SMs)
		s := byLabel[label]
		if s == nil {
			s = &series{label: label}
			byLabel[label] = s
			order = append(order, label)
		}
		s.pts = append(s.pts, plotter.XY{X: float64(r.Tokens), Y: r.GBps})
	}
	if len(tokens) < 2 {
		return fmt.Errorf("a plot needs a --tokens sweep of at least two positive token counts (have %d)", len(tokens))
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("goep intranode, %d ranks, %s: hidden %d, top-%d of %d experts", rep.Ranks, rep.Device, rep.Hidden, rep.TopK, rep.Experts)
	p.X.Label.Text = "tokens per rank"
	p.Y.Label.Text = "GB/s (received BF16 bytes incl. self / time, rank 0)"
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for t := range tokens {
		ticks = append(ticks, plot.Tick{Value: float64(t), Label: fmt.Sprint(t)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	// Room above the lines for the legend.
	top := 0.0
	for _, s := range byLabel {
		for _, pt := range s.pts {
			top = max(top, pt.Y)
		}
	}
	p.Y.Min, p.Y.Max = 0, top*(1.15+0.06*float64(len(order)))
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	for i, label := range order {
		s := byLabel[label]
		sort.Slice(s.pts, func(a, b int) bool { return s.pts[a].X < s.pts[b].X })
		line, points, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / 7)
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
