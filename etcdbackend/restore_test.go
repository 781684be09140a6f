package etcdbackend_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// restoreBump is the revision bump of the restores that raise revisions:
// far more than the tests write between a backup and its restore.
const restoreBump = 1_000_000

// TestRestoreFromBackup: etcd restored from a backup (`etcdutl snapshot
// restore`), with and without `--bump-revision --mark-compacted`. The
// session lease of the backup comes back with its keys as they were then,
// and etcd grants it a full TTL again, so its keep-alive succeeds:
//   - a key acquired on that session since the backup is gone, and both
//     renewal paths (Renew, RenewBatch) must report it lost instead of
//     counting the session's keep-alive as its renewal;
//   - a key released since is back, held by nobody, and the session's next
//     renewal pass must delete it, or a holder's session would keep it
//     alive, blocking the key for as long as the holder renews anything;
//   - a key held then and now stays held, with its term;
//   - with the bump, a new acquisition's term is above every term handed
//     out before the restore; without it, etcd's revisions go back and so
//     do terms (the README tells operators to bump).
func TestRestoreFromBackup(t *testing.T) {
	for _, bump := range []uint64{restoreBump, 0} {
		t.Run(fmt.Sprintf("bump %d", bump), func(t *testing.T) {
			ec := testetcd.Start(t)
			ctx := testCtx(t)
			opts := &etcdbackend.Options{Prefix: newPrefix()}
			a := newBackend(t, newClient(t, ec, nil), opts)
			other := newBackend(t, newClient(t, ec, nil), opts)
			const ttl = 10 * time.Second // nothing expires during the test
			acquire := func(b *etcdbackend.Backend, key string) backend.Lease {
				t.Helper()
				l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: ttl})
				if err != nil {
					t.Fatalf("Acquire(%q): %v", key, err)
				}
				return l
			}
			kept := acquire(a, "kept")
			released := acquire(a, "released")
			backup, err := ec.Backup(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			newer := acquire(a, "newer")   // renewed by Renew
			newer2 := acquire(a, "newer2") // renewed by RenewBatch
			if err := a.Release(ctx, released); err != nil {
				t.Fatalf("Release: %v", err)
			}
			cli := newClient(t, ec, nil)
			session := sessionOf(t, cli, opts.Prefix+"kept")
			for _, k := range []string{"newer", "newer2"} {
				if got := sessionOf(t, cli, opts.Prefix+k); got != session {
					t.Fatalf("%s is on lease %x, want the session %x of the keys of the backup", k, got, session)
				}
			}
			// Terms handed out after the backup, well above its revision.
			highest := newer2.Term
			for i := range 20 {
				l := acquire(a, fmt.Sprintf("churn/%d", i))
				highest = max(highest, l.Term)
				if err := a.Release(ctx, l); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}

			if err := ec.RestoreBackup(0, backup, bump); err != nil {
				t.Fatal(err)
			}

			// The clients reconnect: retry while the answer is a failure
			// to reach the server, not a verdict on the lease.
			verdict := func(err error) bool { return err == nil || errors.Is(err, backend.ErrLeaseLost) }
			var renewErr error
			for {
				renewErr = a.Renew(ctx, newer)
				if verdict(renewErr) || ctx.Err() != nil {
					break
				}
			}
			if !errors.Is(renewErr, backend.ErrLeaseLost) {
				t.Errorf("Renew of a key acquired after the backup: got %v, want ErrLeaseLost", renewErr)
			}
			errs := a.RenewBatch(ctx, []backend.Lease{kept, newer2})
			if !errors.Is(errs[1], backend.ErrLeaseLost) {
				t.Errorf("RenewBatch of a key acquired after the backup: got %v, want ErrLeaseLost", errs[1])
			}
			if errs[0] != nil {
				t.Errorf("RenewBatch of a key held at the backup and since: got %v, want nil", errs[0])
			}
			if rec, err := other.Get(ctx, "kept"); err != nil || rec.Term != kept.Term || rec.HolderID != "a" {
				t.Errorf("Get(kept) after the restore: got %+v, %v; want a's record, term %d", rec, err, kept.Term)
			}

			// The key released since the backup was swept by that pass.
			if _, err := other.Acquire(ctx, backend.AcquireRequest{Key: "released", HolderID: "b", TTL: ttl}); err != nil {
				t.Errorf("Acquire of a key released after the backup, after the holder's renewal pass: %v, want it free", err)
			}
			for _, k := range []string{"newer", "newer2"} {
				l, err := other.Acquire(ctx, backend.AcquireRequest{Key: k, HolderID: "b", TTL: ttl})
				if err != nil {
					t.Errorf("Acquire(%q), gone with the restore: %v, want it free", k, err)
					continue
				}
				switch {
				case bump > 0 && l.Term <= highest:
					t.Errorf("term of %s after a restore with a revision bump: got %d, want above %d", k, l.Term, highest)
				case bump == 0 && l.Term > highest:
					// Not a promise: what the README warns about.
					t.Errorf("term of %s after a restore without a revision bump: got %d, above the %d before it; want it lower (etcd's revisions go back), or the README's warning is out of date", k, l.Term, highest)
				}
			}
		})
	}
}

// TestElectorRestoreFromBackup: an elector leads under a key acquired after
// the backup, on a session lease that the backup has (so the session's
// keep-alive succeeds after the restore), and another follows. etcd is
// restored from the backup, with and without a revision bump. The leader's
// key is gone: it must step down within RenewInterval + RequestTimeout of
// the store answering (it is told sooner, by its watch's reset), a leader
// must follow within TTL + 1 s of the store being back, never two at once
// (the follower lost contact with the store, so it waits a TTL before it
// takes a free key; before it did, it led 4-198 ms after the store was
// back, up to 420 ms beside the old leader), and with the bump the new
// term is above the old one.
func TestElectorRestoreFromBackup(t *testing.T) {
	for _, bump := range []uint64{restoreBump, 0} {
		t.Run(fmt.Sprintf("bump %d", bump), func(t *testing.T) {
			ec := testetcd.Start(t)
			ctx := testCtx(t)
			opts := &etcdbackend.Options{Prefix: newPrefix()}
			// A TTL the restore fits in (stopping a server with open
			// watches takes about 5 s): the leader must still lead when
			// the store is back, or nothing is tested.
			eopts := sovereign.Options{TTL: 10 * time.Second, NoStartupJitter: true, Logger: electortest.Logger()}
			ba := newBackend(t, newClient(t, ec, nil), opts)
			bb := newBackend(t, newClient(t, ec, nil), opts)
			// The session of a's leases, granted before the backup.
			if _, err := ba.Acquire(ctx, backend.AcquireRequest{Key: "other", HolderID: "a", TTL: eopts.TTL}); err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			backup, err := ec.Backup(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			var rec electortest.Recorder
			ea, err := sovereign.New(ba, "election", "a", &eopts)
			if err != nil {
				t.Fatal(err)
			}
			rec.Attach(ea)
			rec.Campaign(t, ea)
			electortest.Eventually(t, "a leads", ea.IsLeader)
			term := ea.Term()
			eb, err := sovereign.New(bb, "election", "b", &eopts)
			if err != nil {
				t.Fatal(err)
			}
			rec.Attach(eb)
			rec.Campaign(t, eb)
			electortest.Eventually(t, "b follows a", func() bool {
				st := eb.Status()
				return st.State == sovereign.Follower && st.Leader.HolderID == "a"
			})
			cli := newClient(t, ec, nil)
			if s, e := sessionOf(t, cli, opts.Prefix+"other"), sessionOf(t, cli, opts.Prefix+"election"); s != e {
				t.Fatalf("the election's key is on lease %x, want the session %x of the backup", e, s)
			}

			down := time.Now()
			if err := ec.RestoreBackup(0, backup, bump); err != nil {
				t.Fatal(err)
			}
			up := time.Now()
			// The defaults scaled from the TTL: RenewInterval TTL/2,
			// RequestTimeout TTL/5; 250 ms of slack, as the chaos
			// checker allows.
			window := up.Add(eopts.TTL/2 + eopts.TTL/5 + 250*time.Millisecond)
			if !ea.IsLeader() {
				t.Fatalf("a stopped leading during the restore (%v), before the store was back: nothing tested", up.Sub(down))
			}
			ended := rec.Ended(t, "a", term)
			t.Logf("restore took %v; a's term %d ended %v after the store was back (%v)", up.Sub(down), term, ended.End.Sub(up), ended.Reason)
			if ended.End.After(window) {
				t.Errorf("a's term %d, under a key the restore lost, ended %v after the store was back; want within RenewInterval + RequestTimeout + 250 ms = %v",
					term, ended.End.Sub(up), window.Sub(up))
			}
			var next electortest.Interval
			electortest.Eventually(t, "a new term", func() bool {
				for _, iv := range rec.Intervals() {
					if iv.Start.After(down) {
						next = iv
						return true
					}
				}
				return false
			})
			t.Logf("%s leads under term %d, %v after the store was back", next.ID, next.Term, next.Start.Sub(up))
			if next.Start.After(up.Add(eopts.TTL + time.Second)) {
				t.Errorf("new term began %v after the store was back, want within TTL + 1 s", next.Start.Sub(up))
			}
			if bump > 0 && next.Term <= term {
				t.Errorf("term after a restore with a revision bump: got %d, want above %d", next.Term, term)
			}
			// No overlap: b, which lost contact with the store, takes
			// the free key only a TTL later; a, whose lease the restore
			// lost, acquires again at once.
			ivs := rec.Intervals()
			for i, x := range ivs {
				for _, y := range ivs[i+1:] {
					xEnd, yEnd := x.End, y.End
					if xEnd.IsZero() {
						xEnd = time.Now()
					}
					if yEnd.IsZero() {
						yEnd = time.Now()
					}
					from, to := later(x.Start, y.Start), earlier(xEnd, yEnd)
					if x.ID != y.ID && from.Before(to) {
						t.Errorf("%s (term %d) and %s (term %d) both led from %v to %v after the store was back, want never two at once",
							x.ID, x.Term, y.ID, y.Term, from.Sub(up), to.Sub(up))
					}
				}
			}
		})
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
