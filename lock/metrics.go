package lock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Metrics receives a Locker's measurements, for an adapter to a metrics
// system (the contrib/prometheus module is one); the lock package depends on
// no metrics library. Every method gets the lock's class (see
// Options.Class), never its key, so that per-entity keys do not make
// unbounded label sets. Methods must be safe for concurrent use and must not
// block. Embed NopMetrics to stay compatible when methods are added.
type Metrics interface {
	// Acquired reports one TryAcquire or Acquire call's outcome: result is
	// "acquired", "held", "error" or "cancelled"; wait is how long the call
	// took.
	Acquired(class, result string, wait time.Duration)
	// Released reports a lock ended (released, or lost and then released)
	// after being held for held.
	Released(class string, held time.Duration)
	// Lost reports a lock lost while held; reason is "deadline", "lease
	// lost" or "max hold".
	Lost(class, reason string)
}

// NopMetrics is a Metrics that records nothing.
type NopMetrics struct{}

// Acquired implements Metrics.
func (NopMetrics) Acquired(string, string, time.Duration) {}

// Released implements Metrics.
func (NopMetrics) Released(string, time.Duration) {}

// Lost implements Metrics.
func (NopMetrics) Lost(string, string) {}

// DefaultClass returns a lock key's class for metrics: its first segment,
// up to the first "/" or ":" ("tally/42" and "tally:42" are both "tally").
func DefaultClass(key string) string {
	if i := strings.IndexAny(key, "/:"); i >= 0 {
		return key[:i]
	}
	return key
}

// acquired reports an acquisition call's outcome to the metrics hook.
func (l *Locker) acquired(key string, start time.Time, err error) {
	result := "acquired"
	if err != nil {
		result = failure(err)
	}
	l.opts.Metrics.Acquired(l.opts.Class(key), result, time.Since(start))
}

// failure names an acquisition's failure for the metrics hook.
func failure(err error) string {
	var held *HeldError
	switch {
	case errors.As(err, &held) && held.Err == nil:
		return "held"
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "error"
}

// ErrUnhealthy is wrapped by the errors Check returns.
var ErrUnhealthy = errors.New("lock: unhealthy")

// Check reports whether the Locker is healthy: nil, or an error wrapping
// ErrUnhealthy naming the lock whose Do or TryDo function still runs more
// than tolerance after the lock's context was cancelled (it ignores its
// context: the lock is renewed for it but exclusivity is no longer
// certain), or a lock whose renewals have failed for longer than its TTL.
// It does no I/O.
func (l *Locker) Check(tolerance time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for lk := range l.locks {
		lk.mu.Lock()
		running, cancelled := lk.fnRunning, lk.cancelledAt
		lk.mu.Unlock()
		if running && !cancelled.IsZero() && now.Sub(cancelled) > tolerance {
			return fmt.Errorf("%w: the function holding lock %q still runs %v after its context was cancelled",
				ErrUnhealthy, lk.key, now.Sub(cancelled).Round(time.Millisecond))
		}
		if st := lk.hold.Status(); st.Failures > 0 && now.Sub(st.LastRenewal) > lk.p.ttl {
			return fmt.Errorf("%w: lock %q: the backend has not answered a renewal for %v: %v",
				ErrUnhealthy, lk.key, now.Sub(st.LastRenewal).Round(time.Millisecond), st.LastError)
		}
	}
	return nil
}

// HealthHandler returns an http.Handler for a health endpoint: 200 "ok"
// while Check(tolerance) is nil, else 503 with the error.
func (l *Locker) HealthHandler(tolerance time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := l.Check(tolerance); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}
