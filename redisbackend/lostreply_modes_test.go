package redisbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// lostModeEnv is a real server and Backends on it, each with its
// connection up and the scripts loaded (see TestAcquireWithLostReply): b
// loses acquisitions' replies; other acts for other holder IDs; twin has
// b's holder ID ("a") but not its memory.
type lostModeEnv struct {
	srv            *testredis.Server
	ctx            context.Context
	b, other, twin *redisbackend.Backend
}

func newLostModeEnv(t *testing.T, prefix string) *lostModeEnv {
	t.Helper()
	srv := testredis.Start(t)
	e := &lostModeEnv{srv: srv, ctx: ctxBound(t)}
	e.b = newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: prefix})
	e.other = newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: prefix})
	e.twin = newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: prefix})
	for _, x := range []*redisbackend.Backend{e.b, e.other, e.twin} {
		l, err := x.AcquireMode(e.ctx, lostReq("lock/warm", "w", backend.Shared, 0))
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Release(e.ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// lostReq is a request for key by holder with a minute's TTL.
func lostReq(key, holder string, mode backend.Mode, limit int) backend.ModeRequest {
	return backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: key, HolderID: holder, TTL: time.Minute},
		Mode: mode, Limit: limit}
}

// lose sends req by b to the stopped server, so that the call times out,
// then resumes the server, which runs it with nobody reading the reply.
func (e *lostModeEnv) lose(t *testing.T, req backend.ModeRequest) {
	t.Helper()
	e.srv.Pause(t)
	short, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	_, err := e.b.AcquireMode(short, req)
	cancel()
	e.srv.Resume(t)
	if err == nil || errors.As(err, new(*backend.HeldError)) {
		t.Fatalf("AcquireMode while the server is stopped: got %v, want a timeout", err)
	}
}

// lostHolder waits until key has a holder "a" (the lost acquisition ran)
// and returns its record.
func (e *lostModeEnv) lostHolder(t *testing.T, key string) backend.Record {
	t.Helper()
	var lost backend.Record
	eventually(t, "the stalled acquisition runs once the server resumes", func() bool {
		recs, err := e.other.Holders(e.ctx, key)
		for _, r := range recs {
			if r.HolderID == "a" {
				lost = r
			}
		}
		return err == nil && lost.Token != ""
	})
	return lost
}

// tokens returns the tokens of key's holders.
func (e *lostModeEnv) tokens(t *testing.T, key string) []string {
	t.Helper()
	recs, err := e.other.Holders(e.ctx, key)
	if err != nil {
		t.Fatalf("Holders: %v", err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.Token)
	}
	return out
}

// wantHeld fails unless err is a HeldError, which it returns.
func wantHeld(t *testing.T, what string, err error) *backend.HeldError {
	t.Helper()
	var held *backend.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("%s: got %v, want HeldError", what, err)
	}
	return held
}

// TestAcquireModeWithLostReplySemaphore: a permit of a semaphore taken by
// an acquisition whose reply was lost (the server stalled and ran it on
// resuming) is nobody's: other holders, and another Backend with the same
// holder ID, see it taken, but the Backend that sent it deletes it at its
// next acquisition of the key, which gets a permit at once with a greater
// term (limit reached), and leaves no second permit held by nobody (limit
// not reached).
func TestAcquireModeWithLostReplySemaphore(t *testing.T) {
	t.Run("limit reached", func(t *testing.T) {
		e := newLostModeEnv(t, "lrs:")
		const key = "lock/sem"
		c, err := e.other.AcquireMode(e.ctx, lostReq(key, "c", backend.Shared, 2))
		if err != nil {
			t.Fatal(err)
		}
		e.lose(t, lostReq(key, "a", backend.Shared, 2))
		lost := e.lostHolder(t, key)
		_, err = e.other.AcquireMode(e.ctx, lostReq(key, "d", backend.Shared, 2))
		wantHeld(t, "another holder's AcquireMode", err)
		_, err = e.twin.AcquireMode(e.ctx, lostReq(key, "a", backend.Shared, 2))
		wantHeld(t, "AcquireMode by another Backend with the same holder ID (it does not have the token)", err)

		l, err := e.b.AcquireMode(e.ctx, lostReq(key, "a", backend.Shared, 2))
		if err != nil {
			t.Fatalf("AcquireMode by the Backend whose reply was lost: %v, want a permit at once", err)
		}
		if l.Term <= lost.Term {
			t.Errorf("term: %d, want above the lost acquisition's %d", l.Term, lost.Term)
		}
		if got := e.tokens(t, key); len(got) != 2 || got[0] != c.Token || got[1] != l.Token {
			t.Errorf("holders' tokens: got %q, want [%q %q] (the lost permit deleted)", got, c.Token, l.Token)
		}
		for _, x := range []backend.Lease{c, l} {
			if err := e.other.Release(e.ctx, x); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("limit not reached", func(t *testing.T) {
		e := newLostModeEnv(t, "lrs2:")
		const key = "lock/sem"
		e.lose(t, lostReq(key, "a", backend.Shared, 2))
		e.lostHolder(t, key)
		l, err := e.b.AcquireMode(e.ctx, lostReq(key, "a", backend.Shared, 2))
		if err != nil {
			t.Fatalf("AcquireMode by the Backend whose reply was lost: %v", err)
		}
		if got := e.tokens(t, key); len(got) != 1 || got[0] != l.Token {
			t.Errorf("holders' tokens: got %q, want [%q] (the lost permit deleted)", got, l.Token)
		}
		if _, err := e.other.AcquireMode(e.ctx, lostReq(key, "d", backend.Shared, 2)); err != nil {
			t.Errorf("another holder's AcquireMode of the second permit: %v", err)
		}
	})
}

// TestAcquireModeWithLostReplyFair: a Fair acquisition whose reply was
// lost, run by the server on resuming while the key was held, leaves a
// waiter registration that no caller renews or withdraws: every later Fair
// acquirer waits behind it until its TTL. The Backend that sent it
// withdraws it at its next acquisition of the key with another wait ID,
// and takes the key at once; but not while a later attempt with that wait
// ID was answered HELD (the wait goes on: the registration is its own).
func TestAcquireModeWithLostReplyFair(t *testing.T) {
	const key = "lock/fair"
	fair := func(holder, waitID string) backend.ModeRequest {
		r := lostReq(key, holder, backend.Exclusive, 0)
		r.Fair, r.WaitID = true, waitID
		return r
	}
	// setup: x holds the key, and b's acquisition with wait ID w1, lost,
	// has registered behind it.
	setup := func(t *testing.T, prefix string) (*lostModeEnv, backend.Lease) {
		e := newLostModeEnv(t, prefix)
		x, err := e.other.AcquireMode(e.ctx, fair("x", ""))
		if err != nil {
			t.Fatal(err)
		}
		e.lose(t, fair("a", "w1"))
		eventually(t, "the stalled acquisition registers once the server resumes", func() bool {
			_, err := e.other.AcquireMode(e.ctx, fair("y", ""))
			var held *backend.HeldError
			return errors.As(err, &held) && held.Waiting == 1
		})
		return e, x
	}
	t.Run("lost registration", func(t *testing.T) {
		e, x := setup(t, "lrf:")
		if err := e.other.Release(e.ctx, x); err != nil {
			t.Fatal(err)
		}
		held := wantHeld(t, "another holder's Fair AcquireMode of the free key", e.otherErr(fair("y", "")))
		if held.Waiting != 1 {
			t.Fatalf("another holder's Fair AcquireMode: waiting %d, want 1 (the lost registration)", held.Waiting)
		}
		wantHeld(t, "Fair AcquireMode by another Backend with the same holder ID", e.twinErr(fair("a", "")))

		l, err := e.b.AcquireMode(e.ctx, fair("a", "w2"))
		if err != nil {
			t.Fatalf("Fair AcquireMode by the Backend whose reply was lost: %v, want the key at once", err)
		}
		if err := e.b.Release(e.ctx, l); err != nil {
			t.Fatal(err)
		}
		if _, err := e.other.AcquireMode(e.ctx, fair("y", "")); err != nil {
			t.Errorf("another holder's Fair AcquireMode after that release: %v, want the key (no registration left)", err)
		}
	})
	t.Run("wait goes on", func(t *testing.T) {
		e, x := setup(t, "lrf2:")
		wantHeld(t, "AcquireMode with the lost wait ID while the key is held", e.bErr(fair("a", "w1")))
		held := wantHeld(t, "AcquireMode with another wait ID", e.bErr(fair("a", "w2")))
		if held.Waiting != 1 {
			t.Errorf("AcquireMode with another wait ID: waiting %d, want 1 (w1's registration kept: its wait goes on)", held.Waiting)
		}
		for _, w := range []string{"w1", "w2"} {
			if err := e.b.CancelWait(e.ctx, key, w); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.other.Release(e.ctx, x); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAcquireModeWithLostReplyHierarchy: a hierarchical lock taken by an
// acquisition whose reply was lost holds intent on its ancestor, which
// refuses an Exclusive lock there: the Backend that sent it deletes the
// lock and its intent when its acquisition of the ancestor names it (by
// AcquireMode, or by a plain Acquire), and when it acquires the lock
// itself again.
func TestAcquireModeWithLostReplyHierarchy(t *testing.T) {
	const parent, child = "lock/h", "lock/h/c"
	childReq := lostReq(child, "a", backend.Exclusive, 0)
	childReq.Ancestors = []string{parent}
	for _, tc := range []struct {
		name    string
		acquire func(e *lostModeEnv) (backend.Lease, error)
	}{
		{"AcquireMode of the ancestor", func(e *lostModeEnv) (backend.Lease, error) {
			return e.b.AcquireMode(e.ctx, lostReq(parent, "a", backend.Exclusive, 0))
		}},
		{"Acquire of the ancestor", func(e *lostModeEnv) (backend.Lease, error) {
			return e.b.Acquire(e.ctx, backend.AcquireRequest{Key: parent, HolderID: "a", TTL: time.Minute})
		}},
		{"AcquireMode of the lock", func(e *lostModeEnv) (backend.Lease, error) {
			return e.b.AcquireMode(e.ctx, childReq)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLostModeEnv(t, "lrh:")
			e.lose(t, childReq)
			lost := e.lostHolder(t, child)
			wantHeld(t, "another holder's AcquireMode of the ancestor", e.otherErr(lostReq(parent, "y", backend.Exclusive, 0)))
			l, err := tc.acquire(e)
			if err != nil {
				t.Fatalf("acquisition by the Backend whose reply was lost: %v, want it at once", err)
			}
			if got := e.tokens(t, child); len(got) > 0 && got[0] == lost.Token {
				t.Errorf("the lost lock is still held: %q", got)
			}
			if err := e.b.Release(e.ctx, l); err != nil {
				t.Fatal(err)
			}
			if _, err := e.other.AcquireMode(e.ctx, lostReq(parent, "y", backend.Exclusive, 0)); err != nil {
				t.Errorf("another holder's AcquireMode of the ancestor after that release: %v, want it (no intent left)", err)
			}
		})
	}
}

// bErr, otherErr and twinErr return the error of an AcquireMode by b,
// other or twin.
func (e *lostModeEnv) bErr(req backend.ModeRequest) error {
	_, err := e.b.AcquireMode(e.ctx, req)
	return err
}

func (e *lostModeEnv) otherErr(req backend.ModeRequest) error {
	_, err := e.other.AcquireMode(e.ctx, req)
	return err
}

func (e *lostModeEnv) twinErr(req backend.ModeRequest) error {
	_, err := e.twin.AcquireMode(e.ctx, req)
	return err
}
