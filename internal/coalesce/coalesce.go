// Package coalesce holds what the schedulers that batch periodic requests
// share: the grid of instants on which requests of one interval fall due
// together (Grid), how long a batch gathers the requests of one instant
// (Gather), the bound of one batch call (MaxBatch), and how many batch calls
// of one instant are in flight at once (MaxInFlight, Chunks).
//
// The lease keeper (package internal/keeper) renews every hold of one
// backend and renew interval from one scheduler on this grid, and the
// elector (package sovereign) sends the heartbeats of every election of one
// backend and heartbeat interval the same way, so an instance holding
// thousands of leases sends one batch per instant (per slot, on Redis
// Cluster) and costs no goroutine at rest.
package coalesce

import (
	"sync"
	"sync/atomic"
	"time"
)

// Gather is how long a batch waits, after its first request, for the
// requests due at the same instant (whose timers fire a few microseconds
// apart) before it is sent.
const Gather = time.Millisecond

// MaxBatch bounds the requests of one batch call.
const MaxBatch = 4096

// MaxInFlight bounds the batch calls of one instant in flight at once, when
// the requests due at that instant fill more than one call (more than
// MaxBatch of them).
//
// Calls sent one after the other add up their latencies: 100,000 leases are
// 25 calls, and one call that hangs until its timeout delays every call
// after it, eating the margin between a lease's renewal and its holder's
// deadline. All at once would put every request of the instant on the store
// in one burst (and, on a hung store, hold one connection or stream per
// call). Four in flight is the middle: a call that hangs takes one slot
// while the other three carry the rest of the instant, 25 calls take 7
// rounds rather than 25, and at most 4 × MaxBatch requests are in flight,
// which go-redis's connection pool (10 per CPU) and etcd's one gRPC
// connection carry without queueing behind one another; beyond that the
// client's CPU, which encodes and decodes every call, is the bound.
const MaxInFlight = 4

// Chunks calls send(w, c) once for each chunk c in [0, chunks), with up to
// MaxInFlight calls running at once, and returns when all have returned.
// The calling goroutine is worker 0; when there is more than one chunk,
// Chunks starts up to MaxInFlight-1 goroutines (workers 1 and on), which
// end with the instant's last call. Each worker takes the next chunk not
// yet taken whenever its call returns, so a slow or hung call delays no
// other chunk; w lets the caller keep buffers per worker.
func Chunks(chunks int, send func(w, c int)) {
	if chunks <= 1 {
		if chunks == 1 {
			send(0, 0)
		}
		return
	}
	var taken atomic.Int64
	work := func(w int) {
		for c := int(taken.Add(1)) - 1; c < chunks; c = int(taken.Add(1)) - 1 {
			send(w, c)
		}
	}
	var workers sync.WaitGroup
	for w := 1; w < min(chunks, MaxInFlight); w++ {
		workers.Go(func() { work(w) })
	}
	work(0)
	workers.Wait()
}

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
