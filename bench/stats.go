package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// percentile returns the p-th percentile (0..100) of xs by the nearest-rank
// method, or NaN when xs is empty.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// median returns the median of xs (the mean of the middle two for an even
// count), or NaN when xs is empty. NaN entries are ignored.
func median(xs []float64) float64 {
	s := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Column names of the table.
const (
	colSovMemory  = "Sovereign-memory"
	colSovRedis   = "Sovereign-Redis"
	colSovCluster = "Sovereign-Redis Cluster"
	colSovEtcd    = "Sovereign-etcd"
	colElection   = "etcd concurrency.Election"
	colMutex      = "etcd concurrency.Mutex"
	colRedsync    = "redsync/v4"
	colRedislock  = "bsm/redislock"
)

var columns = []string{colSovMemory, colSovRedis, colSovCluster, colSovEtcd, colElection, colMutex, colRedsync, colRedislock}

// results collects, for each row and column, one figure per run; the table
// shows the median of each cell's figures.
type results struct {
	rows  []string                        // in order of first use
	cells map[string]map[string][]float64 // row -> column -> figure per run
	fmts  map[string]string               // row -> format verb
	notes []string

	// For the plots: curves[chart][column] are (x, y) points of a cost
	// curve, samples[chart][column] raw latency samples (ms) of a
	// distribution, failed[chart][column] the counts where a many run
	// failed.
	curves  map[string]map[string][]point
	samples map[string]map[string][]float64
	failed  map[string]map[string][]float64
}

// point is one point of a curve.
type point struct{ x, y float64 }

func newResults() *results {
	return &results{cells: make(map[string]map[string][]float64), fmts: make(map[string]string),
		curves: make(map[string]map[string][]point), samples: make(map[string]map[string][]float64),
		failed: make(map[string]map[string][]float64)}
}

// point adds a point to a cost curve.
func (r *results) point(chart, col string, x, y float64) {
	if math.IsNaN(y) {
		return
	}
	if r.curves[chart] == nil {
		r.curves[chart] = make(map[string][]point)
	}
	r.curves[chart][col] = append(r.curves[chart][col], point{x, y})
}

// sample adds latency samples (ms) to a distribution.
func (r *results) sample(chart, col string, ms ...float64) {
	if r.samples[chart] == nil {
		r.samples[chart] = make(map[string][]float64)
	}
	r.samples[chart][col] = append(r.samples[chart][col], ms...)
}

// fail records that a many run of col failed at s.n, for the plots.
func (r *results) fail(col string, s manySpec) {
	chart := "elections"
	if s.locks {
		chart = "locks"
	}
	if r.failed[chart] == nil {
		r.failed[chart] = make(map[string][]float64)
	}
	r.failed[chart][col] = append(r.failed[chart][col], float64(s.n))
}

// add records one run's figure for row and column; format is the Printf verb
// used to show the row's medians.
func (r *results) add(row, col, format string, v float64) {
	r.row(row, format)
	r.cells[row][col] = append(r.cells[row][col], v)
}

// row registers row, shown with format, so that rows appear in the order
// registered rather than in the order their first figure arrives.
func (r *results) row(row, format string) {
	if _, ok := r.cells[row]; !ok {
		r.rows = append(r.rows, row)
		r.cells[row] = make(map[string][]float64)
		r.fmts[row] = format
	}
}

// note adds a line printed under the table.
func (r *results) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// get returns the median of a cell and whether it has figures.
func (r *results) get(row, col string) (float64, bool) {
	v, ok := r.cells[row][col]
	if !ok || len(v) == 0 {
		return 0, false
	}
	return median(v), true
}

// markdown renders one markdown table: a row per measure, a column per
// implementation that has at least one figure, "—" where a measure does
// not apply or was not run.
func (r *results) markdown() string {
	var cols []string
	for _, c := range columns {
		for _, row := range r.rows {
			if _, ok := r.get(row, c); ok {
				cols = append(cols, c)
				break
			}
		}
	}
	var b strings.Builder
	b.WriteString("| Measure |")
	for _, c := range cols {
		b.WriteString(" " + c + " |")
	}
	b.WriteString("\n|---|")
	for range cols {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, row := range r.rows {
		b.WriteString("| " + row + " |")
		for _, c := range cols {
			v, ok := r.get(row, c)
			switch {
			case !ok:
				b.WriteString(" — |")
			case math.IsNaN(v):
				b.WriteString(" n/a |")
			default:
				b.WriteString(" " + fmt.Sprintf(r.fmts[row], v) + " |")
			}
		}
		b.WriteString("\n")
	}
	for _, n := range r.notes {
		b.WriteString("\n" + n + "\n")
	}
	return b.String()
}
