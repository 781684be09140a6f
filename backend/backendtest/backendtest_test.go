package backendtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// brokenEnv names the environment variable that selects a broken backend in
// the child process of TestSuiteCatchesBrokenBackends.
const brokenEnv = "BACKENDTEST_BROKEN"

// broken wraps a memory backend client and breaks one promise of the
// contract, the one its name says (none when the name is "none").
type broken struct {
	backend.Backend
	w    backend.Watcher
	name string
}

// mutations maps the name of each broken backend to the subtest that must
// catch it. ConcurrentUse has no entry: what it catches (data races, a
// non-atomic acquire under contention) shows only under -race or with a
// lucky interleaving, so no mutation fails it every time.
var mutations = map[string]string{
	"blind-overwrite":          "AcquireIsAtomic",
	"renew-ignores-owner":      "RenewAndReleaseAreOwnerChecked",
	"release-ignores-owner":    "RenewAndReleaseAreOwnerChecked",
	"renew-after-release":      "LeaseLostAfterRelease",
	"renew-resurrects-expired": "LeaseLostAfterExpiry",
	"constant-term":            "TermsStrictlyIncrease",
	"renew-does-nothing":       "RenewExtends",
	"no-holder-heartbeat":      "Record",
	"members-unsorted":         "HeartbeatsAndMembers",
	"get-free-no-error":        "GetFreeKey",
	"watch-drops-release":      "Watch",
	"ignores-cancel":           "CancelledContext",
	"close-does-nothing":       "Closed",
	"metadata-dropped":         "Record",
	"short-ttl-granted":        "LeaseExpires",
	"expires-early":            "LeaseExpires",
	"held-error-wrong-holder":  "HeldErrorNamesHolder",
	"same-id-reenters":         "SameHolderIDDifferentToken",
	"get-accepts-empty-key":    "InvalidArguments",
}

func (b *broken) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	ctx = b.ctx(ctx)
	granted := req.TTL
	switch b.name {
	case "metadata-dropped":
		req.Metadata = nil
	case "expires-early":
		req.TTL /= 4
	}
	l, err := b.Backend.Acquire(ctx, req)
	l.TTL = max(l.TTL, granted)
	var held *backend.HeldError
	switch {
	case b.name == "same-id-reenters" && errors.As(err, &held) && held.Holder.HolderID == req.HolderID:
		return b.overwrite(ctx, req, held.Holder)
	case b.name == "held-error-wrong-holder" && errors.As(err, &held):
		held.Holder.HolderID = "someone-else"
	case b.name == "blind-overwrite" && errors.As(err, &held):
		return b.overwrite(ctx, req, held.Holder)
	case b.name == "constant-term":
		l.Term = 1
	case b.name == "short-ttl-granted":
		l.TTL = req.TTL / 2
	}
	return l, err
}

// overwrite removes the holder's lease (using the token its record shows)
// and acquires in its place: what a backend without an atomic acquire does.
func (b *broken) overwrite(ctx context.Context, req backend.AcquireRequest, holder backend.Record) (backend.Lease, error) {
	_ = b.Backend.Release(ctx, backend.Lease{Key: holder.Key, HolderID: holder.HolderID, Token: holder.Token, Term: holder.Term, TTL: req.TTL})
	return b.Backend.Acquire(ctx, req)
}

func (b *broken) Renew(ctx context.Context, l backend.Lease) error {
	switch b.name {
	case "renew-does-nothing":
		return nil
	case "renew-resurrects-expired":
		if _, err := b.Backend.Get(ctx, l.Key); errors.Is(err, backend.ErrNotHeld) {
			_, err := b.Backend.Acquire(ctx, backend.AcquireRequest{Key: l.Key, HolderID: l.HolderID, TTL: l.TTL})
			return err
		}
	}
	err := b.Backend.Renew(b.ctx(ctx), l)
	switch {
	case b.name == "renew-ignores-owner" && errors.Is(err, backend.ErrLeaseLost):
		return nil
	case b.name == "renew-after-release" && errors.Is(err, backend.ErrLeaseLost):
		if _, gerr := b.Backend.Get(ctx, l.Key); errors.Is(gerr, backend.ErrNotHeld) {
			return nil
		}
	}
	return err
}

func (b *broken) Release(ctx context.Context, l backend.Lease) error {
	err := b.Backend.Release(b.ctx(ctx), l)
	if b.name == "release-ignores-owner" && errors.Is(err, backend.ErrLeaseLost) {
		if rec, gerr := b.Backend.Get(ctx, l.Key); gerr == nil {
			return b.Backend.Release(ctx, backend.Lease{Key: rec.Key, HolderID: rec.HolderID, Token: rec.Token, Term: rec.Term, TTL: time.Second})
		}
	}
	return err
}

func (b *broken) Get(ctx context.Context, key string) (backend.Record, error) {
	if b.name == "get-accepts-empty-key" && key == "" {
		return backend.Record{}, backend.ErrNotHeld
	}
	rec, err := b.Backend.Get(b.ctx(ctx), key)
	switch {
	case b.name == "no-holder-heartbeat":
		rec.HeartbeatAt, rec.HeartbeatAge = time.Time{}, 0
	case b.name == "constant-term":
		rec.Term = 1
	case b.name == "get-free-no-error" && errors.Is(err, backend.ErrNotHeld):
		return backend.Record{Key: key}, nil
	}
	return rec, err
}

func (b *broken) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	return b.Backend.Heartbeat(b.ctx(ctx), key, id, ttl)
}

func (b *broken) Members(ctx context.Context, key string) ([]backend.Member, error) {
	ms, err := b.Backend.Members(b.ctx(ctx), key)
	if b.name == "members-unsorted" {
		slices.Reverse(ms)
	}
	return ms, err
}

func (b *broken) RemoveMember(ctx context.Context, key, id string) error {
	return b.Backend.RemoveMember(b.ctx(ctx), key, id)
}

func (b *broken) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	ch, err := b.w.Watch(b.ctx(ctx), key)
	if err != nil || b.name != "watch-drops-release" {
		return ch, err
	}
	out := make(chan backend.Event, 16)
	go func() {
		defer close(out)
		for e := range ch {
			if e.Type == backend.EventChanged {
				out <- e
			}
		}
	}()
	return out, nil
}

func (b *broken) Close() error {
	if b.name == "close-does-nothing" {
		return nil
	}
	return b.Backend.Close()
}

func (b *broken) ctx(ctx context.Context) context.Context {
	if b.name == "ignores-cancel" {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// TestBrokenChild runs the suite against the broken backend named by
// $BACKENDTEST_BROKEN; it is a child process of
// TestSuiteCatchesBrokenBackends and skips when run directly.
func TestBrokenChild(t *testing.T) {
	name := os.Getenv(brokenEnv)
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenBackends")
	}
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		store := memorybackend.NewStore()
		return backendtest.Env{
			Open: func() backend.Backend {
				c := store.Client()
				return &broken{Backend: c, w: c, name: name}
			},
			ShortTTL: 200 * time.Millisecond,
		}
	})
}

// TestSuiteCatchesBrokenBackends checks that each subtest fails for a backend
// that breaks the promise it tests.
func TestSuiteCatchesBrokenBackends(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("child process")
	}
	for name, subtest := range mutations {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenChild$/^"+subtest+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("subtest %s passed against a backend with %q, want a failure\n%s", subtest, name, out)
			}
			if want := "--- FAIL: TestBrokenChild/" + subtest + " "; !strings.Contains(string(out), want) {
				t.Fatalf("output: got\n%s\nwant a line %q", out, want)
			}
		})
	}
}

// TestSuitePassesUnbrokenWrapper makes sure the wrapper itself keeps the
// contract when nothing is broken, so the failures above come from the
// mutation alone.
func TestSuitePassesUnbrokenWrapper(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		store := memorybackend.NewStore()
		return backendtest.Env{
			Open: func() backend.Backend {
				c := store.Client()
				return &broken{Backend: c, w: c, name: "none"}
			},
			ShortTTL: 200 * time.Millisecond,
		}
	})
}
