package sovereign_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/memorybackend"
)

type recMetrics struct {
	sovereign.NopMetrics
	mu       sync.Mutex
	acquired []uint64
	renewed  int
	failed   int
	lost     []sovereign.LossReason
}

func (m *recMetrics) LeadershipAcquired(_ string, term uint64, _ time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acquired = append(m.acquired, term)
}

func (m *recMetrics) LeaseRenewed(string, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.renewed++
}

func (m *recMetrics) RenewFailed(string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failed++
}

func (m *recMetrics) LeadershipLost(_ string, _ uint64, r sovereign.LossReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost = append(m.lost, r)
}

func TestMetricsHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		cl := store.Client()
		defer cl.Close()
		m := &recMetrics{}
		o := fastOpts()
		o.Metrics = m
		e, err := sovereign.New(cl, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1600 * time.Millisecond) // three renewals, every 500ms
		term := e.Term()
		cl.Partition()
		time.Sleep(time.Second)
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.acquired) != 1 || m.acquired[0] != term {
			t.Errorf("LeadershipAcquired: got %v, want [%d]", m.acquired, term)
		}
		if m.renewed < 2 {
			t.Errorf("LeaseRenewed: got %d calls in 1.6s, want about 3", m.renewed)
		}
		if m.failed == 0 {
			t.Error("RenewFailed: got no call while partitioned")
		}
		if len(m.lost) != 1 || m.lost[0] != sovereign.ReasonDeadline {
			t.Errorf("LeadershipLost: got %v, want [deadline]", m.lost)
		}
	})
}

func TestCheck(t *testing.T) {
	t.Run("leader function ignoring its context", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			cl := store.Client()
			defer cl.Close()
			e, err := sovereign.New(cl, "election", "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = e.Run(ctx, func(context.Context) error { <-release; return nil }) // ignores its context
			}()
			time.Sleep(100 * time.Millisecond)
			if err := e.Check(time.Second); err != nil {
				t.Fatalf("Check while leading: %v", err)
			}
			resigned := make(chan error, 1)
			go func() { resigned <- e.Resign(context.Background()) }() // returns once fn has returned

			time.Sleep(500 * time.Millisecond)
			if err := e.Check(time.Second); err != nil {
				t.Errorf("Check 500ms after the cancel, tolerance 1s: got %v, want nil", err)
			}
			time.Sleep(time.Second)
			err = e.Check(time.Second)
			if !errors.Is(err, sovereign.ErrUnhealthy) {
				t.Errorf("Check 1.5s after the cancel: got %v, want ErrUnhealthy", err)
			}
			rr := httptest.NewRecorder()
			e.HealthHandler(time.Second).ServeHTTP(rr, httptest.NewRequest("GET", "/healthz", nil))
			if rr.Code != http.StatusServiceUnavailable {
				t.Errorf("health handler: got %d, want 503", rr.Code)
			}
			close(release)
			if err := <-resigned; err != nil {
				t.Errorf("Resign: %v", err)
			}
			if err := e.Check(time.Second); err != nil {
				t.Errorf("Check after the function returned: %v", err)
			}
			cancel()
			<-done
		})
	})
	t.Run("backend unreachable", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			cl := store.Client()
			defer cl.Close()
			e, err := sovereign.New(cl, "election", "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			cl.Partition()
			time.Sleep(2 * time.Second)
			if err := e.Check(time.Second); err != nil {
				t.Errorf("Check 2s into an outage (TTL 1s): got %v, want nil (limit 3 TTLs)", err)
			}
			time.Sleep(2 * time.Second)
			if err := e.Check(time.Second); !errors.Is(err, sovereign.ErrUnhealthy) {
				t.Errorf("Check 4s into an outage: got %v, want ErrUnhealthy", err)
			}
			rr := httptest.NewRecorder()
			cl.Heal()
			time.Sleep(time.Second)
			e.HealthHandler(time.Second).ServeHTTP(rr, httptest.NewRequest("GET", "/healthz", nil))
			if rr.Code != http.StatusOK {
				t.Errorf("health handler after the outage: got %d %q, want 200", rr.Code, rr.Body)
			}
		})
	})
}

// levels is a slog.Handler that records each message's level.
type levels struct {
	mu  sync.Mutex
	got map[string][]slog.Level
}

func (h *levels) Enabled(context.Context, slog.Level) bool { return true }
func (h *levels) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *levels) WithGroup(string) slog.Handler            { return h }
func (h *levels) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got[r.Message] = append(h.got[r.Message], r.Level)
	return nil
}

// TestLoggerLevels: Options.Logger defaults to slog.Default() and gets
// transitions at Info and failures at Warn.
func TestLoggerLevels(t *testing.T) {
	mem := memorybackend.New()
	defer mem.Close()
	e, err := sovereign.New(mem, "e", "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Options().Logger; got != slog.Default() {
		t.Errorf("default Logger: got %v, want slog.Default()", got)
	}
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		cl := store.Client()
		defer cl.Close()
		h := &levels{got: map[string][]slog.Level{}}
		o := fastOpts()
		o.Logger = slog.New(h)
		e, err := sovereign.New(cl, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if !e.IsLeader() {
			t.Fatal("not leading on a free key")
		}
		cl.Partition()
		time.Sleep(time.Second) // past the renew deadline
		cl.Heal()
		synctest.Wait()
		h.mu.Lock()
		defer h.mu.Unlock()
		for msg, want := range map[string]slog.Level{
			"sovereign: became leader": slog.LevelInfo,
			"sovereign: state changed": slog.LevelInfo,
			"sovereign: stepped down":  slog.LevelInfo,
			"sovereign: renew":         slog.LevelWarn,
		} {
			got := h.got[msg]
			if len(got) == 0 {
				t.Errorf("%q: not logged, want it at %v", msg, want)
			}
			for _, l := range got {
				if l != want {
					t.Errorf("%q: logged at %v, want %v", msg, l, want)
				}
			}
		}
	})
}
