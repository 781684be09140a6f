// Package coalesce holds what the schedulers that batch periodic requests
// share: the grid of instants on which requests of one interval fall due
// together (Grid), how long a batch gathers the requests of one instant
// (Gather), and the bound of one batch call (MaxBatch).
//
// The lease keeper (package internal/keeper) renews every hold of one
// backend and renew interval from one scheduler on this grid, and the
// elector (package sovereign) sends the heartbeats of every election of one
// backend and heartbeat interval the same way, so an instance holding
// thousands of leases sends one batch per instant (per slot, on Redis
// Cluster) and costs no goroutine at rest.
package coalesce

import "time"

// Gather is how long a batch waits, after its first request, for the
// requests due at the same instant (whose timers fire a few microseconds
// apart) before it is sent.
const Gather = time.Millisecond

// MaxBatch bounds the requests of one batch call.
const MaxBatch = 4096

// Grid returns how long until the next instant on the grid of multiples of
// interval (counted from the zero time), at most interval from now: holds
// that renew on the grid of one interval all fall due together.
func Grid(now time.Time, interval time.Duration) time.Duration {
	next := now.Truncate(interval).Add(interval)
	d := next.Sub(now.Round(0))
	if d <= 0 || d > interval {
		return interval
	}
	return d
}
