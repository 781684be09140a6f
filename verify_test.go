package sovereign_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// On a backend whose Acquire reply does not confirm the lease, the double
// verification reads the record back and checks holder, token and term
// (README, "Safety model"). A read-back that differs in any one of them, or
// that fails, fails the verification: the elector does not lead on that
// acquisition, releases it at once, and leads only on a later, verified one.
// (TestDoubleVerificationFailure covers another token.)
func TestDoubleVerificationOfTheReadBack(t *testing.T) {
	errRead := errors.New("test: read refused")
	for _, tc := range []struct {
		name   string
		damage func(*backend.Record) error
	}{
		{"another holder", func(r *backend.Record) error { r.HolderID = "b"; return nil }},
		{"another term", func(r *backend.Record) error { r.Term++; return nil }},
		{"read fails", func(*backend.Record) error { return errRead }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memorybackend.New()
				defer mem.Close()
				h := &hooked{Backend: mem} // hides AcquireConfirmer: the record is read back
				var damaged atomic.Bool
				h.onGet = func(ctx context.Context, key string) (backend.Record, error, bool) {
					if damaged.Swap(true) {
						return backend.Record{}, nil, false
					}
					r, err := mem.Get(ctx, key)
					if err != nil {
						t.Errorf("read back: %v", err)
					}
					if err := tc.damage(&r); err != nil {
						return backend.Record{}, err, true
					}
					return r, nil, true
				}
				e, err := sovereign.New(h, "election", "a", fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				rec := &electortest.Recorder{}
				rec.Attach(e)
				if err := e.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
				// Less than the TTL (1s): the failed acquisition must have
				// been released, not left to expire, for the retry to lead.
				time.Sleep(500 * time.Millisecond)
				synctest.Wait()
				var failed []error
				var acquired []uint64
				for _, s := range rec.Events() {
					switch ev := s.Event.(type) {
					case sovereign.ElectionFailed:
						if errors.Is(ev.Err, sovereign.ErrVerificationFailed) {
							failed = append(failed, ev.Err)
						}
					case sovereign.LeadershipAcquired:
						acquired = append(acquired, ev.Term)
						if len(failed) == 0 {
							t.Fatalf("became leader (term %d) on an acquisition whose read-back was damaged", ev.Term)
						}
					}
				}
				if len(failed) != 1 {
					t.Fatalf("verification failures: got %v, want exactly 1", failed)
				}
				if tc.name == "read fails" && !errors.Is(failed[0], errRead) {
					t.Errorf("verification failure %q: got no %q in it, want the read's error wrapped", failed[0], errRead)
				}
				if !e.IsLeader() || e.Term() != 2 {
					t.Errorf("after the retry: got IsLeader %v, term %d; want leader with term 2 (term 1 released, not led on)", e.IsLeader(), e.Term())
				}
				if len(acquired) != 1 || acquired[0] != 2 {
					t.Errorf("LeadershipAcquired terms: got %v, want [2]", acquired)
				}
			})
		})
	}
}
