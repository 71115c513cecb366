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
	var ls lineSet
	tokens := map[int]bool{}
	for _, r := range rep.Rows {
		if r.Bytes == 0 || r.Tokens <= 0 || r.US <= 0 {
			continue
		}
		tokens[r.Tokens] = true
		label := fmt.Sprintf("%s %s %s (%d SMs)", r.Op, r.Dtype, r.Mode, r.SMs)
		ls.add(label, float64(r.Tokens), r.GBps)
	}
	if len(tokens) < 2 {
		return fmt.Errorf("a plot needs a --tokens sweep of at least two positive token counts (have %d)", len(tokens))
	}
	title := fmt.Sprintf("goep intranode, %d ranks, %s: hidden %d, top-%d of %d experts", rep.Ranks, rep.Device, rep.Hidden, rep.TopK, rep.Experts)
	p, err := tokensPlot(title, "GB/s (received BF16 bytes incl. self / time, rank 0)", &ls, tokens)
	if err != nil {
		return err
	}
	return savePlot(p, prefix)
}

// tokensPlot draws ls against tokens per rank (log scale, a tick at each
// count, from zero up, the legend above the lines).
func tokensPlot(title, yLabel string, ls *lineSet, tokens map[int]bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "tokens per rank"
	p.Y.Label.Text = yLabel
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for t := range tokens {
		ticks = append(ticks, plot.Tick{Value: float64(t), Label: fmt.Sprint(t)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	// Room above the lines for the legend.
	p.Y.Min, p.Y.Max = 0, ls.maxY()*(1.15+0.06*float64(len(ls.order)))
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	if err := ls.draw(p, true); err != nil {
		return nil, err
	}
	return p, nil
}

// lineSet collects points by line label, in first-seen order.
type lineSet struct {
	order   []string
	byLabel map[string]plotter.XYs
}

func (ls *lineSet) add(label string, x, y float64) {
	if ls.byLabel == nil {
		ls.byLabel = map[string]plotter.XYs{}
	}
	if _, ok := ls.byLabel[label]; !ok {
		ls.order = append(ls.order, label)
	}
	ls.byLabel[label] = append(ls.byLabel[label], plotter.XY{X: x, Y: y})
}

func (ls *lineSet) maxY() float64 {
	top := 0.0
	for _, pts := range ls.byLabel {
		for _, pt := range pts {
			top = max(top, pt.Y)
		}
	}
	return top
}

// draw adds every line (points sorted by x) with its legend entry; dashed
// varies the dash pattern every seven colours.
func (ls *lineSet) draw(p *plot.Plot, dashed bool) error {
	for i, label := range ls.order {
		pts := ls.byLabel[label]
		sort.Slice(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		if dashed {
			line.Dashes = plotutil.Dashes(i / 7)
		}
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(label, line, points)
	}
	return nil
}

// savePlot writes p as prefix.png and prefix.svg.
func savePlot(p *plot.Plot, prefix string) error {
	for _, ext := range []string{"png", "svg"} {
		if err := p.Save(10*vg.Inch, 6*vg.Inch, prefix+"."+ext); err != nil {
			return err
		}
	}
	return nil
}
