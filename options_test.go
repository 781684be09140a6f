package sovereign_test

import (
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// The limits of Options at their boundaries, and the defaults that depend
// on other fields (TestBadOptions has the rest).
func TestOptionsLimitsAndDerivedDefaults(t *testing.T) {
	mem := memorybackend.New()
	defer mem.Close()
	for _, tc := range []struct {
		name     string
		opts     sovereign.Options
		contains string
	}{
		{"negative TTL", sovereign.Options{TTL: -1}, "TTL is negative"},
		{"negative RenewDeadline", sovereign.Options{RenewDeadline: -1}, "RenewDeadline is negative"},
		{"negative RenewInterval", sovereign.Options{RenewInterval: -1}, "RenewInterval is negative"},
		{"negative RequestTimeout", sovereign.Options{RequestTimeout: -1}, "RequestTimeout is negative"},
		{"negative HeartbeatInterval", sovereign.Options{HeartbeatInterval: -1}, "HeartbeatInterval is negative"},
		{"negative HeartbeatTTL", sovereign.Options{HeartbeatTTL: -1}, "HeartbeatTTL is negative"},
		{"negative StartupJitter", sovereign.Options{StartupJitter: -1}, "StartupJitter is negative"},
		{"negative ResignSitOut", sovereign.Options{ResignSitOut: -1}, "ResignSitOut is negative"},
		{"request timeout equal to the deadline", sovereign.Options{RequestTimeout: 7 * time.Second},
			"RequestTimeout (7s) must be less than RenewDeadline (7s)"},
		{"heartbeat interval equal to its TTL", sovereign.Options{HeartbeatInterval: 15 * time.Second},
			"HeartbeatInterval (15s) must be less than HeartbeatTTL (15s)"},
		{"request timeout too short", sovereign.Options{RequestTimeout: 50 * time.Microsecond},
			"RequestTimeout (50µs) must be at least 100µs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Logger = quiet
			e, err := sovereign.New(mem, "e", "a", &tc.opts)
			if !errors.Is(err, sovereign.ErrInvalidOptions) {
				t.Fatalf("New: got %v, %v; want ErrInvalidOptions", e, err)
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Errorf("error %q: want it to say %q", err, tc.contains)
			}
		})
	}
	t.Run("TTL equal to the backend's minimum", func(t *testing.T) {
		if _, err := sovereign.New(limited{mem}, "e", "a", &sovereign.Options{TTL: time.Second, Logger: quiet}); err != nil {
			t.Errorf("New with TTL = MinTTL (1s): got %v, want nil (at least MinTTL)", err)
		}
	})
	t.Run("defaults at most RenewInterval", func(t *testing.T) {
		e, err := sovereign.New(mem, "e", "a", &sovereign.Options{RenewInterval: time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		o := e.Options()
		if o.RequestTimeout != time.Second || o.ResignSitOut != time.Second {
			t.Errorf("with RenewInterval 1s (TTL 10s): got RequestTimeout %v, ResignSitOut %v; want 1s each (1/5 of TTL, at most RenewInterval)",
				o.RequestTimeout, o.ResignSitOut)
		}
	})
	t.Run("NoStartupJitter wins", func(t *testing.T) {
		e, err := sovereign.New(mem, "e", "a", &sovereign.Options{StartupJitter: 3 * time.Second, NoStartupJitter: true, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Options().StartupJitter; got != 0 {
			t.Errorf("StartupJitter with NoStartupJitter set: got %v, want 0", got)
		}
	})
}

// TestWarnsWhenARenewalCannotBeRetried: New warns when a renewal that
// times out could not be retried before the renew deadline (its attempt
// waits at least RenewInterval/4, so the retry comes by RenewInterval*5/4),
// and only then: not for the defaults (RenewInterval TTL/2), nor for any
// RequestTimeout (a periodic attempt waits less when that leaves room for
// the retry).
func TestWarnsWhenARenewalCannotBeRetried(t *testing.T) {
	for _, c := range []struct {
		name string
		opts sovereign.Options
		warn bool
	}{
		{"defaults", sovereign.Options{}, false},
		{"defaults at TTL 2s", sovereign.Options{TTL: 2 * time.Second}, false},
		{"RenewInterval TTL/3", sovereign.Options{TTL: 2 * time.Second, RenewInterval: 2 * time.Second / 3}, false},
		{"RequestTimeout 5s at TTL 10s", sovereign.Options{RequestTimeout: 5 * time.Second}, false},
		{"RenewInterval 0.55 TTL", sovereign.Options{TTL: 2 * time.Second, RenewInterval: 1100 * time.Millisecond}, false},
		{"RenewInterval 0.56 TTL", sovereign.Options{TTL: 2 * time.Second, RenewInterval: 1120 * time.Millisecond}, true},
		{"RenewInterval 0.6 TTL", sovereign.Options{TTL: 2 * time.Second, RenewInterval: 1200 * time.Millisecond}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var warned atomic.Int32
			o := c.opts
			o.Logger = slog.New(countHandler{prefix: "sovereign: a renewal that times out is not retried", n: &warned})
			b := memorybackend.New()
			defer b.Close()
			e, err := sovereign.New(b, "election", "a", &o)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if got := warned.Load() == 1; got != c.warn {
				t.Errorf("warnings: got %d, want %v", warned.Load(), c.warn)
			}
		})
	}
}
