package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Backend operations counted by countingBackend.
const (
	opAcquire = iota
	opRenew
	opRelease
	opGet
	opSetMetadata
	opList
	opHeartbeat
	opMembers
	opRemoveMember
	opWatch
	opRenewBatch     // one call; its leases count under Renew too
	opHeartbeatBatch // one call; its heartbeats count under Heartbeat too
	opAcquireMode
	opHolders
	opCancelWait
	numOps
)

var opNames = [numOps]string{"Acquire", "Renew", "Release", "Get", "SetMetadata", "List", "Heartbeat", "Members", "RemoveMember", "Watch",
	"RenewBatch", "HeartbeatBatch", "AcquireMode", "Holders", "CancelWait"}

// Outcomes of a backend call, by kind of error.
const (
	outOK = iota
	outHeld
	outNotHeld
	outLeaseLost
	outTimeout  // context.DeadlineExceeded
	outCanceled // context.Canceled
	outTooMany  // etcd "too many requests" (apply backlog)
	outOther    // anything else
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "held", "not-held", "lease-lost", "timeout", "canceled", "too-many-requests", "other"}

// classify returns the outcome of a call that returned err.
func classify(err error) int {
	switch {
	case err == nil:
		return outOK
	case errors.Is(err, backend.ErrHeld):
		return outHeld
	case errors.Is(err, backend.ErrNotHeld):
		return outNotHeld
	case errors.Is(err, backend.ErrLeaseLost):
		return outLeaseLost
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return outTimeout
	case errors.Is(err, context.Canceled):
		return outCanceled
	case strings.Contains(err.Error(), "too many requests"):
		return outTooMany
	}
	return outOther
}

// countingBackend wraps a backend and counts its calls by method and
// outcome, and their latency. With events set it also counts the watch
// events delivered, by type, and the watch channels closed; that costs a
// goroutine per watch, so only the diagnostic mode sets it. Use it through
// compose, which gives it the inner backend's optional capabilities.
type countingBackend struct {
	inner   backend.Backend
	watcher backend.Watcher
	events  bool

	calls   [numOps][numOutcomes]atomic.Int64
	latency [numOps]atomic.Int64 // total, ns
	slowest [numOps]atomic.Int64 // ns
	evs     [backend.EventReset + 1]atomic.Int64
	closes  atomic.Int64 // watch channels closed by the backend
	items   atomic.Int64 // renewals and heartbeats counted inside batch calls

	mu     sync.Mutex
	others map[string]int // messages of outOther errors, first 200 bytes, up to 20 kinds
}

var _ wrapper = (*countingBackend)(nil)

func newCountingBackend(b backend.Backend, events bool) *countingBackend {
	w, _ := b.(backend.Watcher)
	return &countingBackend{inner: b, watcher: w, events: events, others: make(map[string]int)}
}

func (c *countingBackend) done(op int, t0 time.Time, err error) {
	o := classify(err)
	c.calls[op][o].Add(1)
	d := int64(time.Since(t0))
	c.latency[op].Add(d)
	for {
		s := c.slowest[op].Load()
		if d <= s || c.slowest[op].CompareAndSwap(s, d) {
			break
		}
	}
	if o == outOther {
		msg := err.Error()
		if len(msg) > 200 {
			msg = msg[:200]
		}
		c.mu.Lock()
		if _, ok := c.others[msg]; ok || len(c.others) < 20 {
			c.others[msg]++
		}
		c.mu.Unlock()
	}
}

// batchDone counts a batch call (by its first error) and each of its items.
func (c *countingBackend) batchDone(op, itemOp int, t0 time.Time, errs []error) {
	var first error
	for _, err := range errs {
		c.done(itemOp, t0, err)
		c.items.Add(1)
		if first == nil {
			first = err
		}
	}
	c.done(op, t0, first)
}

func (c *countingBackend) renewBatch(ctx context.Context, inner backend.BatchRenewer, leases []backend.Lease) []error {
	t0 := time.Now()
	errs := inner.RenewBatch(ctx, leases)
	c.batchDone(opRenewBatch, opRenew, t0, errs)
	return errs
}

func (c *countingBackend) heartbeatBatch(ctx context.Context, inner backend.BatchHeartbeater, reqs []backend.HeartbeatRequest) []error {
	t0 := time.Now()
	errs := inner.HeartbeatBatch(ctx, reqs)
	c.batchDone(opHeartbeatBatch, opHeartbeat, t0, errs)
	return errs
}

func (c *countingBackend) acquireMode(ctx context.Context, inner backend.Modes, req backend.ModeRequest) (backend.Lease, error) {
	t0 := time.Now()
	l, err := inner.AcquireMode(ctx, req)
	c.done(opAcquireMode, t0, err)
	return l, err
}

func (c *countingBackend) holders(ctx context.Context, inner backend.Modes, key string) ([]backend.Record, error) {
	t0 := time.Now()
	r, err := inner.Holders(ctx, key)
	c.done(opHolders, t0, err)
	return r, err
}

func (c *countingBackend) cancelWait(ctx context.Context, inner backend.Modes, key, waitID string) error {
	t0 := time.Now()
	err := inner.CancelWait(ctx, key, waitID)
	c.done(opCancelWait, t0, err)
	return err
}

func (c *countingBackend) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	t0 := time.Now()
	l, err := c.inner.Acquire(ctx, req)
	c.done(opAcquire, t0, err)
	return l, err
}

func (c *countingBackend) Renew(ctx context.Context, l backend.Lease) error {
	t0 := time.Now()
	err := c.inner.Renew(ctx, l)
	c.done(opRenew, t0, err)
	return err
}

func (c *countingBackend) Release(ctx context.Context, l backend.Lease) error {
	t0 := time.Now()
	err := c.inner.Release(ctx, l)
	c.done(opRelease, t0, err)
	return err
}

func (c *countingBackend) Get(ctx context.Context, key string) (backend.Record, error) {
	t0 := time.Now()
	r, err := c.inner.Get(ctx, key)
	c.done(opGet, t0, err)
	return r, err
}

func (c *countingBackend) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	t0 := time.Now()
	err := c.inner.SetMetadata(ctx, l, md)
	c.done(opSetMetadata, t0, err)
	return err
}

func (c *countingBackend) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	t0 := time.Now()
	r, err := c.inner.List(ctx, prefix)
	c.done(opList, t0, err)
	return r, err
}

func (c *countingBackend) ValidateKey(key string) error { return c.inner.ValidateKey(key) }

func (c *countingBackend) MinTTL() time.Duration { return c.inner.MinTTL() }

func (c *countingBackend) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	t0 := time.Now()
	err := c.inner.Heartbeat(ctx, key, id, ttl)
	c.done(opHeartbeat, t0, err)
	return err
}

func (c *countingBackend) Members(ctx context.Context, key string) ([]backend.Member, error) {
	t0 := time.Now()
	m, err := c.inner.Members(ctx, key)
	c.done(opMembers, t0, err)
	return m, err
}

func (c *countingBackend) RemoveMember(ctx context.Context, key, id string) error {
	t0 := time.Now()
	err := c.inner.RemoveMember(ctx, key, id)
	c.done(opRemoveMember, t0, err)
	return err
}

// watchRenewals counts the subscription call, as Watch does; the events of
// such a watch are not counted by type.
func (c *countingBackend) watchRenewals(ctx context.Context, inner backend.RenewalWatcher, key string, notify func()) (<-chan backend.Event, error) {
	t0 := time.Now()
	ch, err := inner.WatchRenewals(ctx, key, notify)
	c.done(opWatch, t0, err)
	return ch, err
}

// watchRenewalsMuted counts the subscription call, as Watch does.
func (c *countingBackend) watchRenewalsMuted(ctx context.Context, inner backend.RenewalMuter, key string, notify func(), muted *backend.Mute) (<-chan backend.Event, error) {
	t0 := time.Now()
	ch, err := inner.WatchRenewalsMuted(ctx, key, notify, muted)
	c.done(opWatch, t0, err)
	return ch, err
}

func (c *countingBackend) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	if c.watcher == nil {
		return nil, errors.ErrUnsupported
	}
	t0 := time.Now()
	ch, err := c.watcher.Watch(ctx, key)
	c.done(opWatch, t0, err)
	if err != nil || !c.events {
		return ch, err
	}
	out := make(chan backend.Event, cap(ch))
	go func() {
		defer close(out)
		for ev := range ch {
			if ev.Type > 0 && int(ev.Type) < len(c.evs) {
				c.evs[ev.Type].Add(1)
			}
			select {
			case out <- ev:
			default: // the receiver is behind: coalesce, as the backend would
			}
		}
		if ctx.Err() == nil {
			c.closes.Add(1)
		}
	}()
	return out, nil
}

func (c *countingBackend) Close() error { return c.inner.Close() }

// snapshot is the counters at one instant.
type snapshot struct {
	at      time.Time
	calls   [numOps][numOutcomes]int64
	latency [numOps]int64
	evs     [backend.EventReset + 1]int64
	closes  int64
}

func (c *countingBackend) snapshot() snapshot {
	s := snapshot{at: time.Now()}
	for op := range numOps {
		for o := range numOutcomes {
			s.calls[op][o] = c.calls[op][o].Load()
		}
		s.latency[op] = c.latency[op].Load()
	}
	for i := range c.evs {
		s.evs[i] = c.evs[i].Load()
	}
	s.closes = c.closes.Load()
	return s
}

// diff describes the calls between two snapshots, per second: for each
// method with calls, "Method n/s [outcome n ...] mean latency".
func (s snapshot) diff(prev snapshot) string {
	secs := s.at.Sub(prev.at).Seconds()
	var parts []string
	for op := range numOps {
		var n int64
		var outs []string
		for o := range numOutcomes {
			d := s.calls[op][o] - prev.calls[op][o]
			n += d
			if d > 0 && o != outOK {
				outs = append(outs, fmt.Sprintf("%s %d", outcomeNames[o], d))
			}
		}
		if n == 0 {
			continue
		}
		mean := time.Duration((s.latency[op] - prev.latency[op]) / n)
		p := fmt.Sprintf("%s %.0f/s", opNames[op], float64(n)/secs)
		if len(outs) > 0 {
			p += " [" + strings.Join(outs, ", ") + "]"
		}
		p += fmt.Sprintf(" %v", mean.Round(time.Millisecond))
		parts = append(parts, p)
	}
	var evs []string
	for t := backend.EventChanged; t <= backend.EventReset; t++ {
		if d := s.evs[t] - prev.evs[t]; d > 0 {
			evs = append(evs, fmt.Sprintf("%s %d", t, d))
		}
	}
	if d := s.closes - prev.closes; d > 0 {
		evs = append(evs, fmt.Sprintf("closed %d", d))
	}
	if len(evs) > 0 {
		parts = append(parts, "events: "+strings.Join(evs, ", "))
	}
	return strings.Join(parts, "; ")
}

// summary writes every method's totals by outcome, mean and slowest
// latency, the watch events, and the messages of unclassified errors.
func (c *countingBackend) summary(w io.Writer) {
	s := c.snapshot()
	for op := range numOps {
		var n int64
		var outs []string
		for o := range numOutcomes {
			n += s.calls[op][o]
			if s.calls[op][o] > 0 {
				outs = append(outs, fmt.Sprintf("%s %d", outcomeNames[o], s.calls[op][o]))
			}
		}
		if n == 0 {
			continue
		}
		fmt.Fprintf(w, "diag: %-12s %7d calls: %s; mean %v, slowest %v\n", opNames[op], n, strings.Join(outs, ", "),
			time.Duration(s.latency[op]/n).Round(time.Microsecond), time.Duration(c.slowest[op].Load()).Round(time.Millisecond))
	}
	var evs []string
	for t := backend.EventChanged; t <= backend.EventReset; t++ {
		evs = append(evs, fmt.Sprintf("%s %d", t, s.evs[t]))
	}
	fmt.Fprintf(w, "diag: watch events: %s; channels closed by the backend %d\n", strings.Join(evs, ", "), s.closes)
	c.mu.Lock()
	defer c.mu.Unlock()
	msgs := make([]string, 0, len(c.others))
	for m := range c.others {
		msgs = append(msgs, m)
	}
	sort.Slice(msgs, func(i, j int) bool { return c.others[msgs[i]] > c.others[msgs[j]] })
	for _, m := range msgs {
		fmt.Fprintf(w, "diag: other error ×%d: %s\n", c.others[m], m)
	}
}

// grpcCodes counts an etcd client's calls by method and gRPC status code,
// for the diagnostic mode.
type grpcCodes struct {
	mu sync.Mutex
	n  map[string]int64 // "method code" -> count
}

func (g *grpcCodes) add(method string, err error) {
	code := status.Code(err).String()
	if i := strings.LastIndexByte(method, '/'); i >= 0 {
		method = method[i+1:]
	}
	g.mu.Lock()
	g.n[method+" "+code]++
	g.mu.Unlock()
}

// interceptor returns a unary client interceptor that counts.
func (g *grpcCodes) interceptor() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		g.add(method, err)
		return err
	})
}

// write writes the counts, sorted.
func (g *grpcCodes) write(w io.Writer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	keys := make([]string, 0, len(g.n))
	for k := range g.n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "diag: gRPC %-40s %d\n", k, g.n[k])
	}
}

// dumpGoroutines writes the aggregated goroutine profile (stacks with
// counts) to path.
func dumpGoroutines(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "goroutines: %d\n", runtime.NumGoroutine())
	return pprof.Lookup("goroutine").WriteTo(f, 1)
}
