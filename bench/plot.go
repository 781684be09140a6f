package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The plots are hand-written SVG (no plotting dependency): line charts on
// logarithmic axes for the cost curves, step charts for the latency
// distributions.

// colColors gives each implementation one colour in every plot.
var colColors = map[string]string{
	colSovMemory:  "#7f7f7f",
	colSovRedis:   "#d62728",
	colSovCluster: "#ff7f0e",
	colSovEtcd:    "#1f77b4",
	colElection:   "#2ca02c",
	colMutex:      "#9467bd",
	colRedsync:    "#8c564b",
	colRedislock:  "#e377c2",
}

// costPanels are the panels of a cost figure: chart suffix, title, y label.
var costPanels = []struct{ key, title, ylabel string }{
	{"client-cpu", "Client CPU per %s", "µs of CPU per second"},
	{"server-cpu", "Server CPU per %s", "µs of CPU per second"},
	{"requests", "Backend requests per %s", "requests per second"},
	{"heap", "Client heap per %s", "KiB"},
	{"goroutines", "Client goroutines per %s", "goroutines"},
}

// plotData is what the figures are drawn from, kept in dir/data.json so
// that runs of different scales (small ones on a busy machine, large ones
// on a quiet one) add up to one figure.
type plotData struct {
	Curves  map[string]map[string][][2]float64 `json:"curves"`  // chart -> column -> (x, y)
	Samples map[string]map[string][]float64    `json:"samples"` // chart -> column -> ms
	Failed  map[string]map[string][]float64    `json:"failed"`  // chart -> column -> counts
}

// mergePlotData adds to r the figures of dir/data.json that r has not
// measured itself: a curve point of the same chart, column and count, or a
// failure there, replaces the stored one (either way); a column's latency
// samples replace the stored ones. It is not an error if the file does not
// exist.
func (r *results) mergePlotData(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "data.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var d plotData
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "data.json"), err)
	}
	// What this run measured, before anything stored is added to r.
	type key struct {
		scope, col string
		x          float64
	}
	mine := make(map[key]bool)
	for scope, m := range r.failed {
		for col, ns := range m {
			for _, n := range ns {
				mine[key{scope, col, n}] = true
			}
		}
	}
	for chart, m := range r.curves {
		scope, _, _ := strings.Cut(chart, "-")
		for col, ps := range m {
			for _, q := range ps {
				mine[key{scope, col, q.x}] = true
			}
		}
	}
	measured := func(chart, col string, x float64) bool {
		scope, _, _ := strings.Cut(chart, "-")
		return mine[key{scope, col, x}]
	}
	for chart, m := range d.Curves {
		for col, ps := range m {
			for _, p := range ps {
				if !measured(chart, col, p[0]) {
					r.point(chart, col, p[0], p[1])
				}
			}
		}
	}
	for chart, m := range d.Failed {
		for col, ns := range m {
			for _, n := range ns {
				if !measured(chart, col, n) {
					r.fail(col, manySpec{locks: chart == "locks", n: int(n)})
				}
			}
		}
	}
	for chart, m := range d.Samples {
		for col, xs := range m {
			if len(r.samples[chart][col]) == 0 {
				r.sample(chart, col, xs...)
			}
		}
	}
	return nil
}

// savePlotData writes r's figures to dir/data.json.
func (r *results) savePlotData(dir string) error {
	d := plotData{Curves: make(map[string]map[string][][2]float64), Samples: r.samples, Failed: r.failed}
	for chart, m := range r.curves {
		d.Curves[chart] = make(map[string][][2]float64)
		for col, ps := range m {
			for _, p := range ps {
				d.Curves[chart][col] = append(d.Curves[chart][col], [2]float64{p.x, p.y})
			}
		}
	}
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "data.json"), append(b, '\n'), 0o644)
}

// writePlots merges the figures stored in dir (see mergePlotData) into r,
// stores the result, writes the SVG figures there is data for into dir and
// returns their paths.
func (r *results) writePlots(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := r.mergePlotData(dir); err != nil {
		return nil, err
	}
	if err := r.savePlotData(dir); err != nil {
		return nil, err
	}
	var files []string
	write := func(name, svg string) error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(svg), 0o644); err != nil {
			return err
		}
		files = append(files, p)
		return nil
	}
	for _, scope := range []struct{ chart, unit, title string }{
		{"elections", "election", "Cost per election, one process, by number of elections (default options, TTL 10 s)"},
		{"locks", "lock", "Cost per held lock, one Locker (one session), by number of locks held (TTL 10 s)"},
	} {
		if !r.hasCurves(scope.chart) {
			continue
		}
		if err := write(scope.chart+"-cost.svg", r.costFigure(scope.chart, scope.unit, scope.title)); err != nil {
			return files, err
		}
	}
	for chart, name := range r.distributionCharts() {
		if err := write(name, r.cdfFigure(chart)); err != nil {
			return files, err
		}
	}
	return files, nil
}

func (r *results) hasCurves(chart string) bool {
	for _, p := range costPanels {
		if len(r.curves[chart+"-"+p.key]) > 0 {
			return true
		}
	}
	return len(r.failed[chart]) > 0
}

// distributionCharts maps each latency chart with samples to its file name.
func (r *results) distributionCharts() map[string]string {
	m := make(map[string]string)
	for chart := range r.samples {
		switch {
		case strings.HasPrefix(chart, "Graceful hand-over"):
			m[chart] = "handover-cdf.svg"
		case strings.HasPrefix(chart, "Crash failover"):
			m[chart] = "crash-cdf.svg"
		}
	}
	return m
}

// svgDoc accumulates an SVG document.
type svgDoc struct{ b strings.Builder }

func (d *svgDoc) f(format string, args ...any) { fmt.Fprintf(&d.b, format, args...) }

func (d *svgDoc) text(x, y float64, anchor, style, s string) {
	d.f(`<text x="%.1f" y="%.1f" text-anchor="%s" %s>%s</text>`+"\n", x, y, anchor, style, escapeXML(s))
}

func escapeXML(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// axis maps data values to pixels, linearly or logarithmically.
type axis struct {
	lo, hi float64 // data range (for log axes, powers of ten)
	log    bool
	p0, p1 float64 // pixel range
}

func (a axis) px(v float64) float64 {
	var t float64
	if a.log {
		v = math.Max(v, a.lo)
		t = (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	} else {
		t = (v - a.lo) / (a.hi - a.lo)
	}
	return a.p0 + t*(a.p1-a.p0)
}

// ticks returns the tick values: powers of ten on a log axis, five steps
// on a linear one.
func (a axis) ticks() []float64 {
	var ts []float64
	if a.log {
		for e := math.Floor(math.Log10(a.lo)); e <= math.Log10(a.hi)+1e-9; e++ {
			ts = append(ts, math.Pow(10, e))
		}
		return ts
	}
	for i := range 6 {
		ts = append(ts, a.lo+float64(i)*(a.hi-a.lo)/5)
	}
	return ts
}

// logRange returns powers of ten around the positive values of vs (1 and
// 10 when there are none).
func logRange(vs []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if v > 0 {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return 1, 10
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	return lo, hi
}

// tickLabel writes a tick value briefly: 1k, 10k, 0.01.
func tickLabel(v float64) string {
	switch {
	case v >= 1e6 && math.Mod(v, 1e6) == 0:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3 && math.Mod(v, 1e3) == 0:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}

// frame draws a panel's axes, grid, ticks and labels.
func (d *svgDoc) frame(x, y axis, title, xlabel, ylabel string, xFmt func(float64) string) {
	top, bottom, left, right := y.p1, y.p0, x.p0, x.p1
	d.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", left, top, right-left, bottom-top)
	for _, t := range x.ticks() {
		p := x.px(t)
		d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", p, top, p, bottom)
		d.text(p, bottom+14, "middle", `font-size="10"`, xFmt(t))
	}
	for _, t := range y.ticks() {
		p := y.px(t)
		d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, p, right, p)
		d.text(left-4, p+3, "end", `font-size="10"`, tickLabel(t))
	}
	d.text((left+right)/2, top-8, "middle", `font-size="12" font-weight="bold"`, title)
	d.text((left+right)/2, bottom+30, "middle", `font-size="10"`, xlabel)
	d.f(`<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
		left-42, (top+bottom)/2, left-42, (top+bottom)/2, escapeXML(ylabel))
}

// legend draws one entry per column at the top of a figure.
func (d *svgDoc) legend(cols []string, y float64) {
	x := 20.0
	for _, c := range cols {
		d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"/>`+"\n", x, y-4, x+18, y-4, colColors[c])
		d.text(x+22, y, "start", `font-size="11"`, c)
		x += 30 + 6.5*float64(len(c))
	}
}

// orderedColumns returns the columns present in m, in table order.
func orderedColumns[V any](ms ...map[string]V) []string {
	var cols []string
	for _, c := range columns {
		for _, m := range ms {
			if _, ok := m[c]; ok {
				cols = append(cols, c)
				break
			}
		}
	}
	return cols
}

// costFigure draws the cost panels of chart (elections or locks): per-unit
// cost against the number of units, both axes logarithmic. A run that
// failed is a cross on the panel's top edge at its count.
func (r *results) costFigure(chart, unit, title string) string {
	const pw, ph, cols = 330.0, 230.0, 3
	var all []map[string][]point
	for _, p := range costPanels {
		all = append(all, r.curves[chart+"-"+p.key])
	}
	legendCols := orderedColumns(append(all, toPoints(r.failed[chart]))...)
	rows := (len(costPanels) + cols - 1) / cols
	width, height := 70+cols*(pw+80), 60+float64(rows)*(ph+70)+30
	var d svgDoc
	d.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif">`+"\n", width, height)
	d.f(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	d.text(20, 20, "start", `font-size="14" font-weight="bold"`, title)
	d.legend(legendCols, 42)
	var xs []float64
	for _, m := range all {
		for _, ps := range m {
			for _, p := range ps {
				xs = append(xs, p.x)
			}
		}
	}
	for _, ns := range r.failed[chart] {
		xs = append(xs, ns...)
	}
	xlo, xhi := logRange(xs)
	for i, p := range costPanels {
		m := all[i]
		left := 70 + float64(i%cols)*(pw+80)
		top := 80 + float64(i/cols)*(ph+70)
		var ys []float64
		for _, ps := range m {
			for _, q := range ps {
				ys = append(ys, q.y)
			}
		}
		ylo, yhi := logRange(ys)
		xa := axis{lo: xlo, hi: xhi, log: true, p0: left, p1: left + pw}
		ya := axis{lo: ylo, hi: yhi, log: true, p0: top + ph, p1: top}
		d.frame(xa, ya, fmt.Sprintf(p.title, unit), unit+"s (log)", p.ylabel+" (log)", tickLabel)
		for _, c := range orderedColumns(m) {
			ps := slices.Clone(m[c])
			slices.SortFunc(ps, func(a, b point) int { return cmpFloat(a.x, b.x) })
			var path []string
			for _, q := range ps {
				path = append(path, fmt.Sprintf("%.1f,%.1f", xa.px(q.x), ya.px(q.y)))
			}
			d.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(path, " "), colColors[c])
			for _, q := range ps {
				fill := colColors[c]
				if q.y <= ylo { // at or below the axis: drawn on its edge, hollow
					fill = "white"
				}
				d.f(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s" stroke="%s"><title>%s: %s %ss, %.4g</title></circle>`+"\n",
					xa.px(q.x), ya.px(q.y), fill, colColors[c], escapeXML(c), tickLabel(q.x), unit, q.y)
			}
		}
		for _, c := range orderedColumns(r.failed[chart]) {
			for _, n := range r.failed[chart][c] {
				x, y := xa.px(n), top+6
				d.f(`<path d="M%.1f %.1f l8 8 m0 -8 l-8 8" stroke="%s" stroke-width="2.5"><title>%s: %s %ss failed</title></path>`+"\n",
					x-4, y-4, colColors[c], escapeXML(c), tickLabel(n), unit)
			}
		}
	}
	d.text(20, height-12, "start", `font-size="10" fill="#555"`,
		"Hollow points: at or below the axis minimum (0). A cross on a panel's top edge: that run failed (not every "+unit+" had its "+
			map[string]string{"election": "leader", "lock": "holder"}[unit]+"). Memory: no server; its requests are backend calls.")
	d.f("</svg>\n")
	return d.b.String()
}

func toPoints(m map[string][]float64) map[string][]point {
	out := make(map[string][]point)
	for k := range m {
		out[k] = nil
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// cdfFigure draws the empirical distribution of a latency chart's samples,
// one step line per implementation, latency on a logarithmic axis.
func (r *results) cdfFigure(chart string) string {
	const w, h = 640.0, 340.0
	m := r.samples[chart]
	cols := orderedColumns(m)
	var all []float64
	for _, xs := range m {
		all = append(all, xs...)
	}
	xlo, xhi := logRange(all)
	var d svgDoc
	d.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif">`+"\n", w+120, h+145)
	d.f(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	d.text(20, 20, "start", `font-size="14" font-weight="bold"`, chart+": distribution")
	d.legend(cols, 42)
	xa := axis{lo: xlo, hi: xhi, log: true, p0: 80, p1: 80 + w}
	ya := axis{lo: 0, hi: 1, p0: 80 + h, p1: 80}
	d.frame(xa, ya, "", "ms (log)", "fraction of samples at or below", tickLabel)
	for _, c := range cols {
		xs := slices.Clone(m[c])
		slices.Sort(xs)
		var path []string
		prev := 0.0
		for i, x := range xs {
			f := float64(i+1) / float64(len(xs))
			path = append(path, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", xa.px(x), ya.px(prev), xa.px(x), ya.px(f)))
			prev = f
		}
		if len(xs) > 0 {
			path = append(path, fmt.Sprintf("%.1f,%.1f", xa.p1, ya.px(1)))
		}
		d.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"><title>%s: %d samples, p50 %.1f ms, max %.1f ms</title></polyline>`+"\n",
			strings.Join(path, " "), colColors[c], escapeXML(c), len(xs), percentile(xs, 50), percentile(xs, 100))
	}
	var counts []string
	for _, c := range cols {
		counts = append(counts, fmt.Sprintf("%s %d", c, len(m[c])))
	}
	d.text(20, h+135, "start", `font-size="10" fill="#555"`, "Samples, all rounds: "+strings.Join(counts, ", "))
	d.f("</svg>\n")
	return d.b.String()
}
