package main

import (
	"fmt"
	"image/color"

	"github.com/gpumem/tlsf/internal/trace"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotReplays writes, per trace, live bytes and each backend's reserved
// bytes over the first replay (op index on x, GiB on y). With one trace
// the plot goes to file; with several, to FILE-TRACE.ext each, and say
// is told each file written. The format is the file's extension, .svg or
// .png.
func plotReplays(file string, traces []*trace.Trace, results []*replayResult, say func(string)) error {
	for _, t := range traces {
		name := outputName(file, traces, t)
		var rs []*replayResult
		for _, r := range results {
			if r.Trace == t.Name && len(r.series) > 0 {
				rs = append(rs, r)
			}
		}
		if err := plotTrace(name, t.Name, rs); err != nil {
			return fmt.Errorf("--plot %s: %w", name, err)
		}
		say(fmt.Sprintf("plot of %s: %s", t.Name, name))
	}
	return nil
}

func plotTrace(file, traceName string, rs []*replayResult) error {
	p := plot.New()
	p.Title.Text = traceName + ": live and reserved device memory over the first replay"
	p.X.Label.Text = "operation"
	p.Y.Label.Text = "GiB"
	p.Legend.Top = true
	p.Legend.Left = true
	const giB = 1 << 30
	if len(rs) > 0 {
		live := make(plotter.XYs, len(rs[0].series))
		for i, s := range rs[0].series {
			live[i] = plotter.XY{X: float64(s.Op), Y: float64(s.Live) / giB}
		}
		l, err := plotter.NewLine(live)
		if err != nil {
			return err
		}
		l.Color = color.Black
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		p.Add(l)
		p.Legend.Add("live (trace sizes)", l)
	}
	for i, r := range rs {
		xy := make(plotter.XYs, len(r.series))
		for j, s := range r.series {
			xy[j] = plotter.XY{X: float64(s.Op), Y: float64(s.Reserved) / giB}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add("reserved: "+r.Backend, l)
	}
	return p.Save(10*vg.Inch, 5*vg.Inch, file)
}
