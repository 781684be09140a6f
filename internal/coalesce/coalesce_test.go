package coalesce_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/internal/coalesce"
)

func TestGrid(t *testing.T) {
	iv := 200 * time.Millisecond
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, off := range []time.Duration{0, time.Millisecond, 199 * time.Millisecond, 200 * time.Millisecond, 333 * time.Millisecond} {
		now := base.Add(off)
		d := coalesce.Grid(now, iv)
		if d <= 0 || d > iv {
			t.Errorf("Grid(+%v): %v, want in (0, %v]", off, d, iv)
		}
		if next := now.Add(d); next.Sub(base)%iv != 0 {
			t.Errorf("Grid(+%v): next instant +%v is not on the grid", off, next.Sub(base))
		}
	}
}
