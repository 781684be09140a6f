package redisbackend_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// These tests cover decisions of the clean-up after a lost reply
// (lostreply.go) that mutations showed no other test to check.

// loseAcquire is lose for a plain Acquire by b.
func (e *lostModeEnv) loseAcquire(t *testing.T, req backend.AcquireRequest) {
	t.Helper()
	e.srv.Pause(t)
	short, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	_, err := e.b.Acquire(short, req)
	cancel()
	e.srv.Resume(t)
	if err == nil || errors.As(err, new(*backend.HeldError)) {
		t.Fatalf("Acquire while the server is stopped: got %v, want a timeout", err)
	}
}

// newLostPlainEnv is newLostModeEnv with the scripts of a plain Acquire
// and Release loaded as well.
func newLostPlainEnv(t *testing.T, prefix string) *lostModeEnv {
	t.Helper()
	e := newLostModeEnv(t, prefix)
	for _, x := range []*redisbackend.Backend{e.b, e.other, e.twin} {
		l, err := x.Acquire(e.ctx, backend.AcquireRequest{Key: "warm", HolderID: "w", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Release(e.ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// scriptCalls is how many scripts the server behind c has run.
func scriptCalls(ctx context.Context, c *redis.Client) int {
	return redisbackend.CommandCalls(ctx, c, "evalsha") + redisbackend.CommandCalls(ctx, c, "eval")
}

// TestLostReplyReclaimInOneRoundTrip: AcquireMode passes the tokens of
// the key's lost acquisitions (a plain Acquire's lease, or an entry taken
// with the same ancestors) to its script, which deletes the lease or entry
// and acquires in the same round trip; the new term is above the deleted
// one's even when the key's term counter is ahead of the server's clock
// (the counter is not touched); and the token is forgotten, its lease
// deleted.
func TestLostReplyReclaimInOneRoundTrip(t *testing.T) {
	const key = "lock/one"
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, e *lostModeEnv)
	}{
		{"plain lease", func(t *testing.T, e *lostModeEnv) {
			e.loseAcquire(t, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
		}},
		{"entry", func(t *testing.T, e *lostModeEnv) {
			e.lose(t, lostReq(key, "a", backend.Exclusive, 0))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newLostPlainEnv(t, "lr1:")
			c := e.srv.NewClient(t, nil)
			// An hour of microseconds ahead of the server's clock (as after
			// the clock was stepped back).
			counter := uint64(serverTime(t, e.ctx, c).Add(time.Hour).UnixMicro())
			if err := c.Set(e.ctx, "lr1:{"+key+"}{}:term", strconv.FormatUint(counter, 10), 0).Err(); err != nil {
				t.Fatal(err)
			}
			tc.lose(t, e)
			lost := e.lostHolder(t, key)
			if lost.Term <= counter {
				t.Fatalf("the lost acquisition's term: %d, want above the counter %d", lost.Term, counter)
			}
			before := scriptCalls(e.ctx, c)
			l, err := e.b.AcquireMode(e.ctx, lostReq(key, "a", backend.Exclusive, 0))
			if err != nil {
				t.Fatalf("AcquireMode by the Backend whose reply was lost: %v, want the key at once", err)
			}
			if n := scriptCalls(e.ctx, c) - before; n != 1 {
				t.Errorf("scripts run by that AcquireMode: got %d, want 1 (the lost lease deleted by the acquisition's own script)", n)
			}
			if l.Term <= lost.Term {
				t.Errorf("term: got %d, want above the lost acquisition's %d", l.Term, lost.Term)
			}
			if n := redisbackend.LostTokens(e.b); n != 0 {
				t.Errorf("tokens remembered after the lost lease was deleted: got %d, want 0", n)
			}
			if err := e.b.Release(e.ctx, l); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLostReplyReclaimByHeld: a lost lease that the acquisition's script
// does not delete itself (a plain Acquire's retry; an entry taken with
// other ancestors than the call names, whose intents the script could not
// reach) is released by its token, with its intents, when a HELD reply
// names it, and its token forgotten: nothing of it is left to refuse an
// Exclusive lock of the ancestor.
func TestLostReplyReclaimByHeld(t *testing.T) {
	const parent, child = "lock/rh", "lock/rh/c"
	t.Run("plain Acquire", func(t *testing.T) {
		e := newLostPlainEnv(t, "lr2:")
		req := backend.AcquireRequest{Key: "plain", HolderID: "a", TTL: time.Minute}
		e.loseAcquire(t, req)
		e.lostHolder(t, "plain")
		l, err := e.b.Acquire(e.ctx, req)
		if err != nil {
			t.Fatalf("Acquire by the Backend whose reply was lost: %v, want the key at once", err)
		}
		if n := redisbackend.LostTokens(e.b); n != 0 {
			t.Errorf("tokens remembered after the lost lease was deleted: got %d, want 0", n)
		}
		if err := e.b.Release(e.ctx, l); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("entry with other ancestors", func(t *testing.T) {
		e := newLostModeEnv(t, "lr2:")
		req := lostReq(child, "a", backend.Exclusive, 0)
		req.Ancestors = []string{parent}
		e.lose(t, req)
		e.lostHolder(t, child)
		l, err := e.b.AcquireMode(e.ctx, lostReq(child, "a", backend.Exclusive, 0))
		if err != nil {
			t.Fatalf("AcquireMode (no ancestors) by the Backend whose reply was lost: %v, want the lock at once", err)
		}
		if n := redisbackend.LostTokens(e.b); n != 0 {
			t.Errorf("tokens remembered after the lost entry was deleted: got %d, want 0", n)
		}
		if err := e.b.Release(e.ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := e.otherErr(lostReq(parent, "y", backend.Exclusive, 0)); err != nil {
			t.Errorf("another holder's Exclusive AcquireMode of the ancestor: %v, want it (the lost lock's intent deleted with it)", err)
		}
	})
}

// TestLostReplyReclaimSparesTheHolder: a lost plain acquisition of a key
// that was held (it wrote nothing) leaves its token remembered; the next
// AcquireMode passes it to the script, which deletes a lease only under
// that token: the key's holder, another Backend with the same holder ID,
// keeps its lease.
func TestLostReplyReclaimSparesTheHolder(t *testing.T) {
	const key = "lock/spared"
	e := newLostPlainEnv(t, "lr3:")
	req := backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute}
	held, err := e.twin.Acquire(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	e.loseAcquire(t, req)
	wantHeld(t, "AcquireMode by the Backend whose lost acquisition found the key held", e.bErr(lostReq(key, "a", backend.Exclusive, 0)))
	if err := e.twin.Renew(e.ctx, held); err != nil {
		t.Errorf("Renew by the key's holder: got %v, want nil (its lease kept)", err)
	}
}

// TestLostReplyReclaimPublishesRelease: deleting a lost lease or entry
// publishes its release, as Release does (on the key's channel and, for an
// entry, on each ancestor's), before the acquisition that follows it, and
// withdrawing a lost registration publishes a change, as CancelWait does,
// so that watchers and waiters look again.
func TestLostReplyReclaimPublishesRelease(t *testing.T) {
	e := newLostPlainEnv(t, "lr4:")
	const parent, child = "lock/ev", "lock/ev/c"
	chPlain, chModes, chChild, chParent := "lr4:{plain}:events", "lr4:{lock/m}{}:events", "lr4:{lock/ev}{/c}:events", "lr4:{lock/ev}{}:events"
	chFair, chExpired := "lr4:{lock/f}{}:events", "lr4:{lock/x}{}:events"
	sub := e.srv.NewClient(t, nil).Subscribe(e.ctx, chPlain, chModes, chChild, chParent, chFair, chExpired)
	t.Cleanup(func() { _ = sub.Close() })
	for range 6 { // the confirmations
		if _, err := sub.Receive(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(t *testing.T, channel, payload string) {
		t.Helper()
		for {
			v, err := sub.ReceiveTimeout(e.ctx, 5*time.Second)
			if err != nil {
				t.Fatalf("waiting 5s for %q on %q: %v", payload, channel, err)
			}
			if m, ok := v.(*redis.Message); ok {
				if m.Channel != channel || m.Payload != payload {
					t.Fatalf("message: got %q on %q, want %q on %q", m.Payload, m.Channel, payload, channel)
				}
				return
			}
		}
	}
	term := func(n uint64) string { return strconv.FormatUint(n, 10) }

	t.Run("plain Acquire", func(t *testing.T) {
		req := backend.AcquireRequest{Key: "plain", HolderID: "a", TTL: time.Minute}
		e.loseAcquire(t, req)
		lost := e.lostHolder(t, "plain")
		expect(t, chPlain, "acquired:"+term(lost.Term))
		l, err := e.b.Acquire(e.ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		expect(t, chPlain, "released:"+term(lost.Term))
		expect(t, chPlain, "acquired:"+term(l.Term))
	})
	t.Run("AcquireMode after a plain Acquire", func(t *testing.T) {
		e.loseAcquire(t, backend.AcquireRequest{Key: "lock/m", HolderID: "a", TTL: time.Minute})
		lost := e.lostHolder(t, "lock/m")
		expect(t, chModes, "acquired:"+term(lost.Term))
		l, err := e.b.AcquireMode(e.ctx, lostReq("lock/m", "a", backend.Exclusive, 0))
		if err != nil {
			t.Fatal(err)
		}
		expect(t, chModes, "released:"+term(lost.Term))
		expect(t, chModes, "acquired:"+term(l.Term))
	})
	t.Run("AcquireMode of an entry", func(t *testing.T) {
		req := lostReq(child, "a", backend.Exclusive, 0)
		req.Ancestors = []string{parent}
		e.lose(t, req)
		lost := e.lostHolder(t, child)
		expect(t, chChild, "acquired:"+term(lost.Term))
		l, err := e.b.AcquireMode(e.ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		expect(t, chChild, "released:"+term(lost.Term))
		expect(t, chParent, "released:"+term(lost.Term))
		expect(t, chChild, "acquired:"+term(l.Term))
	})
	t.Run("AcquireMode of an expired entry", func(t *testing.T) {
		// A lost Shared entry that has expired, still in the key's hash
		// (kept by another holder's entry), was not released: its deletion
		// publishes nothing (the next message is the acquisition).
		c, err := e.other.AcquireMode(e.ctx, lostReq("lock/x", "c", backend.Shared, 0))
		if err != nil {
			t.Fatal(err)
		}
		expect(t, chExpired, "acquired:"+term(c.Term))
		req := lostReq("lock/x", "a", backend.Shared, 0)
		req.TTL = 300 * time.Millisecond
		e.lose(t, req)
		lost := e.lostHolder(t, "lock/x")
		expect(t, chExpired, "acquired:"+term(lost.Term))
		eventually(t, "the lost entry expires", func() bool { return len(e.tokens(t, "lock/x")) == 1 })
		l, err := e.b.AcquireMode(e.ctx, lostReq("lock/x", "a", backend.Shared, 0))
		if err != nil {
			t.Fatal(err)
		}
		expect(t, chExpired, "acquired:"+term(l.Term))
	})
	t.Run("Fair AcquireMode after a lost registration", func(t *testing.T) {
		fair := func(holder, waitID string) backend.ModeRequest {
			r := lostReq("lock/f", holder, backend.Exclusive, 0)
			r.Fair, r.WaitID = true, waitID
			return r
		}
		x, err := e.other.AcquireMode(e.ctx, fair("x", ""))
		if err != nil {
			t.Fatal(err)
		}
		expect(t, chFair, "acquired:"+term(x.Term))
		e.lose(t, fair("a", "w1"))
		eventually(t, "the stalled acquisition registers once the server resumes", func() bool {
			_, err := e.other.AcquireMode(e.ctx, fair("y", ""))
			var held *backend.HeldError
			return errors.As(err, &held) && held.Waiting == 1
		})
		if err := e.other.Release(e.ctx, x); err != nil {
			t.Fatal(err)
		}
		expect(t, chFair, "released:"+term(x.Term))
		l, err := e.b.AcquireMode(e.ctx, fair("a", "w2"))
		if err != nil {
			t.Fatal(err)
		}
		expect(t, chFair, "waiter:cancelled")
		expect(t, chFair, "acquired:"+term(l.Term))
	})
}

// TestLostReplyOwnWaitKeepsItsPlace: an AcquireMode with the wait ID of a
// lost Fair acquisition (its caller's next attempt of the same wait) does
// not withdraw that registration, which is its own place in line: it stays
// ahead of a waiter that registered after it, and gets the key first.
func TestLostReplyOwnWaitKeepsItsPlace(t *testing.T) {
	const key = "lock/place"
	fair := fairReq(key)
	e, x := lostFairWait(t, "lr5:", fair)
	if held := wantHeld(t, "Fair AcquireMode of y", e.otherErr(fair("y", "wy"))); held.Waiting != 1 {
		t.Fatalf("Fair AcquireMode of y: waiting %d, want 1 (w1 ahead)", held.Waiting)
	}
	if held := wantHeld(t, "AcquireMode with the lost wait ID", e.bErr(fair("a", "w1"))); held.Waiting != 0 {
		t.Errorf("AcquireMode with the lost wait ID: waiting %d, want 0 (its place, ahead of y, kept)", held.Waiting)
	}
	if err := e.other.Release(e.ctx, x); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, "Fair AcquireMode of y once the key is free", e.otherErr(fair("y", "wy")))
	l, err := e.b.AcquireMode(e.ctx, fair("a", "w1"))
	if err != nil {
		t.Fatalf("AcquireMode with the lost wait ID once the key is free: %v, want the key (first in line)", err)
	}
	if err := e.b.Release(e.ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := e.other.CancelWait(e.ctx, key, "wy"); err != nil {
		t.Fatal(err)
	}
}

// fairReq returns a builder of Fair Exclusive requests of key.
func fairReq(key string) func(holder, waitID string) backend.ModeRequest {
	return func(holder, waitID string) backend.ModeRequest {
		r := lostReq(key, holder, backend.Exclusive, 0)
		r.Fair, r.WaitID = true, waitID
		return r
	}
}

// lostFairWait sets up a lost Fair wait: holder x (the other Backend) holds
// the key, and holder a's Fair acquisition with wait ID w1 is lost (sent
// while the server was stopped), and registers once the server resumes.
// It returns the environment and x's lease.
func lostFairWait(t *testing.T, prefix string, fair func(holder, waitID string) backend.ModeRequest) (*lostModeEnv, backend.Lease) {
	t.Helper()
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

// TestLostReplyEndedWaitWithdrawn: once the wait of a lost Fair
// acquisition has ended (a later attempt of it answered HELD, then its
// CancelWait or a success with it), a registration of its wait ID found
// later is nobody's (scripts sent on different connections are not
// ordered: the lost one may run only now; twin, with the same holder and
// wait ID, writes it here), and the next AcquireMode of the key withdraws
// it.
func TestLostReplyEndedWaitWithdrawn(t *testing.T) {
	const key = "lock/ended"
	fair := fairReq(key)
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, e *lostModeEnv, x backend.Lease)
	}{
		{"CancelWait", func(t *testing.T, e *lostModeEnv, x backend.Lease) {
			if err := e.b.CancelWait(e.ctx, key, "w1"); err != nil {
				t.Fatal(err)
			}
		}},
		{"success", func(t *testing.T, e *lostModeEnv, x backend.Lease) {
			if err := e.other.Release(e.ctx, x); err != nil {
				t.Fatal(err)
			}
			l, err := e.b.AcquireMode(e.ctx, fair("a", "w1"))
			if err != nil {
				t.Fatalf("AcquireMode with the lost wait ID once the key is free: %v", err)
			}
			if err := e.b.Release(e.ctx, l); err != nil {
				t.Fatal(err)
			}
			if _, err := e.other.AcquireMode(e.ctx, fair("x", "")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, x := lostFairWait(t, "lr6:", fair)
			wantHeld(t, "AcquireMode with the lost wait ID while the key is held", e.bErr(fair("a", "w1")))
			tc.end(t, e, x)
			wantHeld(t, "twin's registration of w1", e.twinErr(fair("a", "w1")))
			if held := wantHeld(t, "AcquireMode with another wait ID", e.bErr(fair("a", "w2"))); held.Waiting != 0 {
				t.Errorf("AcquireMode with another wait ID: waiting %d, want 0 (w1's registration withdrawn: its wait has ended)", held.Waiting)
			}
			if err := e.b.CancelWait(e.ctx, key, "w2"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
