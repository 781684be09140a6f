package lock_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

type recMetrics struct {
	mu       sync.Mutex
	acquired []string // class/result
	released []string
	held     []time.Duration
	lost     []string
}

func (m *recMetrics) Acquired(class, result string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acquired = append(m.acquired, class+"/"+result)
}

func (m *recMetrics) Released(class string, held time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = append(m.released, class)
	m.held = append(m.held, held)
}

func (m *recMetrics) Lost(class, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost = append(m.lost, class+"/"+reason)
}

func TestMetricsHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ac := client(t, store)
		m := &recMetrics{}
		o := fastOpts()
		o.Metrics = m
		alice := newLocker(t, ac, "alice", o)
		bob := newLocker(t, client(t, store), "bob", o)
		lk, err := alice.TryAcquire(t.Context(), "tally/42", nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := alice.TryAcquire(t.Context(), "tally/42", nil); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("second TryAcquire: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err = bob.Acquire(ctx, "tally/42", nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("bob's Acquire: %v", err)
		}
		time.Sleep(time.Second)
		if err := lk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		lk2, err := alice.TryAcquire(t.Context(), "extraction:7", nil)
		if err != nil {
			t.Fatal(err)
		}
		ac.Partition()
		<-lk2.Done()
		ac.Heal()
		_ = lk2.Release(t.Context())
		synctest.Wait()
		m.mu.Lock()
		defer m.mu.Unlock()
		if want := []string{"tally/acquired", "tally/held", "tally/cancelled", "extraction/acquired"}; !slices.Equal(m.acquired, want) {
			t.Errorf("Acquired: got %v, want %v", m.acquired, want)
		}
		if want := []string{"tally", "extraction"}; !slices.Equal(m.released, want) {
			t.Errorf("Released: got %v, want %v", m.released, want)
		}
		if len(m.held) > 0 && m.held[0] != time.Second+100*time.Millisecond {
			t.Errorf("first hold: got %v, want 1.1s", m.held[0])
		}
		if want := []string{"extraction/deadline"}; !slices.Equal(m.lost, want) {
			t.Errorf("Lost: got %v, want %v", m.lost, want)
		}
	})
}

func TestCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ac := client(t, store)
		l := newLocker(t, ac, "alice", fastOpts())
		release := make(chan struct{})
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- l.TryDo(context.Background(), "job", nil, func(ctx context.Context, _ *lock.Lock) error {
				close(started)
				<-release // ignores ctx
				return nil
			})
		}()
		<-started
		if err := l.Check(time.Second); err != nil {
			t.Fatalf("Check while the function runs with its lock: %v", err)
		}
		ac.Partition() // lost at the deadline; the function ignores it
		time.Sleep(time.Second)
		if err := l.Check(time.Second); err != nil {
			t.Errorf("Check 300ms after the loss (tolerance 1s): got %v, want nil", err)
		}
		time.Sleep(time.Second)
		if err := l.Check(time.Second); !errors.Is(err, lock.ErrUnhealthy) {
			t.Errorf("Check 1.3s after the loss: got %v, want ErrUnhealthy", err)
		}
		rr := httptest.NewRecorder()
		l.HealthHandler(time.Second).ServeHTTP(rr, httptest.NewRequest("GET", "/healthz", nil))
		if rr.Code != http.StatusServiceUnavailable {
			t.Errorf("health handler: got %d, want 503", rr.Code)
		}
		ac.Heal()
		close(release)
		if err := <-done; !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("TryDo: got %v, want ErrLockLost", err)
		}
		if err := l.Check(time.Second); err != nil {
			t.Errorf("Check after the function returned: %v", err)
		}
	})
}

// A function that ignores its context after the caller cancelled Do's ctx
// (not a loss: the lock is renewed for it as it winds down) makes Check
// unhealthy once it has run on for more than the tolerance, while the
// backend answers every renewal.
func TestCheckFunctionIgnoringCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "alice", fastOpts())
		ctx, cancel := context.WithCancel(context.Background())
		release := make(chan struct{})
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- l.Do(ctx, "job", nil, func(context.Context, *lock.Lock) error {
				close(started)
				<-release // ignores its context
				return nil
			})
		}()
		<-started
		cancel()
		time.Sleep(900 * time.Millisecond)
		if err := l.Check(time.Second); err != nil {
			t.Errorf("Check 900ms after the cancellation (tolerance 1s): got %v, want nil", err)
		}
		time.Sleep(200 * time.Millisecond)
		err := l.Check(time.Second)
		if !errors.Is(err, lock.ErrUnhealthy) || !strings.Contains(err.Error(), "still runs") {
			t.Errorf("Check 1.1s after the cancellation: got %v, want ErrUnhealthy saying the function still runs", err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Errorf("Do: got %v, want nil (the lock was kept while the function wound down)", err)
		}
		if err := l.Check(time.Second); err != nil {
			t.Errorf("Check after the function returned: %v", err)
		}
	})
}

// TestMetricsReasons: the README's sovereign_lock_acquisitions_total result
// "error" and sovereign_locks_lost_total reasons "max hold" and "lease lost"
// reach the hook, by class.
func TestMetricsReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		m := &recMetrics{}
		o := fastOpts()
		o.Metrics = m
		l := newLocker(t, c, "alice", o)

		c.Partition()
		if _, err := l.TryAcquire(t.Context(), "down/1", nil); err == nil || errors.Is(err, lock.ErrHeld) {
			t.Fatalf("TryAcquire with the store down: got %v, want an error", err)
		}
		c.Heal()

		maxHold, err := l.TryAcquire(t.Context(), "batch/1", &lock.AcquireOptions{MaxHold: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		<-maxHold.Done()
		_ = maxHold.Release(t.Context())

		gone, err := l.TryAcquire(t.Context(), "report:9", nil)
		if err != nil {
			t.Fatal(err)
		}
		store.Restart(nil) // the store loses the lease
		<-gone.Done()
		_ = gone.Release(t.Context())
		synctest.Wait()

		m.mu.Lock()
		defer m.mu.Unlock()
		if want := []string{"down/error", "batch/acquired", "report/acquired"}; !slices.Equal(m.acquired, want) {
			t.Errorf("Acquired: got %v, want %v", m.acquired, want)
		}
		if want := []string{"batch/max hold", "report/lease lost"}; !slices.Equal(m.lost, want) {
			t.Errorf("Lost: got %v, want %v", m.lost, want)
		}
	})
}
