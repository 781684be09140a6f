package sovereign

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"
)

// Metrics receives an elector's measurements, for an adapter to a metrics
// system (the contrib/prometheus module is one). The core packages depend on
// no metrics library. Methods are called from the elector's goroutines, never
// concurrently for one event; they must be safe for concurrent use (one
// Metrics may serve many electors) and must not block. Embed NopMetrics to
// stay compatible when methods are added.
type Metrics interface {
	// LeadershipAcquired: this elector leads election with a fresh lease of
	// term, until deadline unless renewed.
	LeadershipAcquired(election string, term uint64, deadline time.Time)
	// LeaseRenewed: a renewal succeeded and moved the deadline.
	LeaseRenewed(election string, deadline time.Time)
	// LeadershipLost: the term ended, for reason.
	LeadershipLost(election string, term uint64, reason LossReason)
	// RenewFailed: a renewal failed and will be retried (until the
	// deadline).
	RenewFailed(election string)
	// EventsDropped: a listener fell behind and lost count events.
	EventsDropped(election string, count int)
}

// NopMetrics is a Metrics that records nothing; embed it in an
// implementation to get the methods it does not need.
type NopMetrics struct{}

// LeadershipAcquired implements Metrics.
func (NopMetrics) LeadershipAcquired(string, uint64, time.Time) {}

// LeaseRenewed implements Metrics.
func (NopMetrics) LeaseRenewed(string, time.Time) {}

// LeadershipLost implements Metrics.
func (NopMetrics) LeadershipLost(string, uint64, LossReason) {}

// RenewFailed implements Metrics.
func (NopMetrics) RenewFailed(string) {}

// EventsDropped implements Metrics.
func (NopMetrics) EventsDropped(string, int) {}

// ErrUnhealthy is wrapped by the errors Check returns.
var ErrUnhealthy = errors.New("sovereign: unhealthy")

// health is what Check reads; it belongs to e.mu.
type health struct {
	fnRunning   bool
	cancelledAt time.Time // when the leader context was cancelled while fn ran; zero otherwise
	startedAt   time.Time
}

func (e *Elector) setFnRunning(running bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.health.fnRunning = running
	if !running {
		e.health.cancelledAt = time.Time{}
	}
}

// backendOK notes that the backend answered a call of e just now.
func (e *Elector) backendOK() { e.backendOKAt(time.Now()) }

// backendOKAt notes that the backend answered a call of e at t (what Check
// reads). It is called for every renewal and heartbeat of every election
// (thousands per batch), so it takes no lock: one atomic store.
func (e *Elector) backendOKAt(t time.Time) {
	e.okAt.Store(int64(t.Sub(e.okBase)))
}

// lastOK returns when the backend last answered a call of e, or the zero
// time if it never did.
func (e *Elector) lastOK() time.Time {
	v := e.okAt.Load()
	if v == noAnswer {
		return time.Time{}
	}
	return e.okBase.Add(time.Duration(v))
}

// noAnswer is Elector.okAt before the backend's first answer.
const noAnswer = math.MinInt64

// unreachableAfter is how many TTLs without an answer from the backend make
// Check report it unreachable.
const unreachableAfter = 3

// Check reports whether the elector is healthy: nil, or an error wrapping
// ErrUnhealthy that says why. It is unhealthy when the leader function still
// runs more than tolerance after its leader context was cancelled (it
// ignores its context, and Close and the next term wait for it), or when the
// backend has not answered for longer than three TTLs while the elector
// runs. It does no I/O.
func (e *Elector) Check(tolerance time.Duration) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	h := e.health
	if h.fnRunning && !h.cancelledAt.IsZero() && now.Sub(h.cancelledAt) > tolerance {
		return fmt.Errorf("%w: election %q: the leader function still runs %v after its context was cancelled",
			ErrUnhealthy, e.name, now.Sub(h.cancelledAt).Round(time.Millisecond))
	}
	if e.started && !e.closed {
		since := e.lastOK()
		if since.IsZero() {
			since = h.startedAt
		}
		if limit := unreachableAfter * e.opts.TTL; now.Sub(since) > limit {
			return fmt.Errorf("%w: election %q: the backend has not answered for %v (more than %v)",
				ErrUnhealthy, e.name, now.Sub(since).Round(time.Millisecond), limit)
		}
	}
	return nil
}

// HealthHandler returns an http.Handler for a health endpoint: 200 "ok"
// while Check(tolerance) is nil, else 503 with the error.
func (e *Elector) HealthHandler(tolerance time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := e.Check(tolerance); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}
