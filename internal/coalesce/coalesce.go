// Package coalesce gathers requests that fall due together, such as the
// heartbeats of every election one process runs on one backend, into one
// batch call.
//
// Callers schedule their requests on one grid of instants (Grid), so that
// they fall due together; Registry.Do then sends those of one key (a
// backend) with one batch call instead of one request each, at most
// MaxBatch at a time. Each request keeps its own context: a caller whose
// context ends returns at once with the context's error, while the batch
// goes on for the others. (The lease keeper, package internal/keeper,
// renews on the same grid and in batches of MaxBatch, but from one
// scheduler per backend and interval rather than one goroutine per
// request.)
package coalesce

import (
	"context"
	"sync"
	"time"
)

// Gather is how long a batch waits, after its first request, for the
// requests due at the same instant (whose timers fire a few microseconds
// apart) before it is sent.
const Gather = time.Millisecond

// MaxBatch bounds the requests of one batch call.
const MaxBatch = 4096

// Send sends items as one batch and returns one error per item, in order.
type Send[T any] func(ctx context.Context, items []T) []error

// Registry holds one Group per key (a backend value), made on demand and
// dropped when idle, so that unrelated callers of one backend share batches.
type Registry[K comparable, T any] struct {
	mu     sync.Mutex
	groups map[K]*group[T]
}

type group[T any] struct {
	send     Send[T]
	queue    []*request[T]
	flushing bool
}

type request[T any] struct {
	ctx  context.Context
	item T
	done chan struct{}
	err  error
}

// Do queues item for key's group and waits for its result or for ctx to
// end. send is used when the group is made; every caller of one key must
// pass an equivalent one.
func (r *Registry[K, T]) Do(ctx context.Context, key K, send Send[T], item T) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	req := &request[T]{ctx: ctx, item: item, done: make(chan struct{})}
	r.mu.Lock()
	if r.groups == nil {
		r.groups = make(map[K]*group[T])
	}
	g := r.groups[key]
	if g == nil {
		g = &group[T]{send: send}
		r.groups[key] = g
	}
	g.queue = append(g.queue, req)
	if !g.flushing {
		g.flushing = true
		go r.flush(key, g)
	}
	r.mu.Unlock()
	select {
	case <-req.done:
		return req.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flush sends g's queue in batches until it is empty, then drops g.
func (r *Registry[K, T]) flush(key K, g *group[T]) {
	t := time.NewTimer(Gather)
	<-t.C
	for {
		r.mu.Lock()
		n := min(len(g.queue), MaxBatch)
		if n == 0 {
			g.flushing = false
			if r.groups[key] == g {
				delete(r.groups, key)
			}
			r.mu.Unlock()
			return
		}
		batch := g.queue[:n:n]
		g.queue = g.queue[n:]
		r.mu.Unlock()
		send(g.send, batch)
	}
}

// send runs one batch of the requests whose context has not ended.
func send[T any](s Send[T], batch []*request[T]) {
	live := batch[:0:0]
	for _, q := range batch {
		if err := q.ctx.Err(); err != nil {
			q.err = err
			close(q.done)
			continue
		}
		live = append(live, q)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := latest(live)
	defer cancel()
	items := make([]T, len(live))
	for i, q := range live {
		items[i] = q.item
	}
	errs := s(ctx, items)
	for i, q := range live {
		if i < len(errs) {
			q.err = errs[i]
		}
		close(q.done)
	}
}

// latest bounds a batch by the latest deadline of its requests (none when
// one has none): one caller's short deadline must not fail the others, and
// each caller returns at its own deadline anyway.
func latest[T any](batch []*request[T]) (context.Context, context.CancelFunc) {
	var d time.Time
	for _, q := range batch {
		qd, ok := q.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if qd.After(d) {
			d = qd
		}
	}
	return context.WithDeadline(context.Background(), d)
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
