package keeper

import (
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// SetWallClock replaces the wall clock for a test and returns a function
// that restores it.
func SetWallClock(f func() time.Time) (restore func()) {
	old := wallNow
	wallNow = f
	return func() { wallNow = old }
}

// Schedulers returns how many schedulers the process keeps for b.
func Schedulers(b backend.Backend) int {
	n := 0
	schedulers.Range(func(k, _ any) bool {
		if k.(schedKey).b == b {
			n++
		}
		return true
	})
	return n
}

// SchedulerOf returns the scheduler h renews through (nil when none), to
// compare with another hold's.
func SchedulerOf(h *Hold) any {
	if h.sch == nil {
		return nil
	}
	return h.sch
}

// RenewAllNow makes every hold of h's scheduler due and runs one renewal
// instant of it in the calling goroutine, as its timer would.
func RenewAllNow(h *Hold) {
	s := h.sch
	s.mu.Lock()
	for _, m := range s.members {
		m.m.due = time.Time{}
	}
	s.mu.Unlock()
	s.run()
}
