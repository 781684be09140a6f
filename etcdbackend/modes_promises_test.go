package etcdbackend_test

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestModesSetMetadataRewritesIntents: the intents of a lock carry its
// record, so that a conflict on an ancestor names the lock below (the
// backend.Modes contract); SetMetadata rewrites them with the entry, so the
// HeldError of an acquisition of the ancestor shows the lock below with its
// new metadata and its own key, in either mode.
func TestModesSetMetadataRewritesIntents(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	for _, m := range []backend.Mode{backend.Exclusive, backend.Shared} {
		t.Run(m.String(), func(t *testing.T) {
			req := modeRequest("t-"+m.String()+"/a/b", "below", m)
			top, mid := "t-"+m.String(), "t-"+m.String()+"/a"
			req.Ancestors = []string{top, mid}
			req.Metadata = map[string]string{"v": "1"}
			l, err := b.AcquireMode(ctx, req)
			if err != nil {
				t.Fatalf("AcquireMode: %v", err)
			}
			defer b.Release(ctx, l)
			md := map[string]string{"v": "2"}
			if err := b.SetMetadata(ctx, l, md); err != nil {
				t.Fatalf("SetMetadata: %v", err)
			}
			for _, anc := range req.Ancestors {
				_, err := b.AcquireMode(ctx, modeRequest(anc, "above", backend.Exclusive))
				var held *backend.HeldError
				if !errors.As(err, &held) {
					t.Fatalf("AcquireMode of ancestor %q: got %v, want a *HeldError", anc, err)
				}
				if len(held.Holders) != 1 {
					t.Fatalf("AcquireMode of ancestor %q: got %d holders, want 1 (the lock below)", anc, len(held.Holders))
				}
				r := held.Holders[0]
				if r.Key != req.Key || r.HolderID != "below" || r.Term != l.Term || r.Mode != m {
					t.Errorf("conflict on %q: got key %q holder %q term %d mode %v, want %q %q %d %v",
						anc, r.Key, r.HolderID, r.Term, r.Mode, req.Key, "below", l.Term, m)
				}
				if !maps.Equal(r.Metadata, md) {
					t.Errorf("conflict on %q: got metadata %v, want %v (as set after the acquisition)", anc, r.Metadata, md)
				}
			}
		})
	}
}

// TestModesDetachedRenewIsOwnerChecked: Renew of a Detached entry (whose
// etcd lease is its own, so a keep-alive alone would succeed) checks the
// entry first: once its intent on an ancestor has gone (deleted by hand),
// the entry no longer protects its tree and Renew reports it lost, as for
// an entry on a session (TestModesLostIntentLosesTheEntry).
func TestModesDetachedRenewIsOwnerChecked(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	req := modeRequest("a/b", "h", backend.Exclusive)
	req.Ancestors = []string{"a"}
	req.Detached = true
	l, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Fatalf("Renew with its intent: %v", err)
	}
	resp, err := raw.Delete(ctx, prefix+"a\x00i", clientv3.WithPrefix())
	if err != nil || resp.Deleted != 1 {
		t.Fatalf("deleting the intent by hand: deleted %d, err %v; want 1, nil", resp.Deleted, err)
	}
	if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of a Detached entry without its intent: got %v, want ErrLeaseLost", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Errorf("Release without its intent: got %v, want nil", err)
	}
}

// TestModesReleaseAndCancelWaitFreeSessionRoom: a session lease is full
// from a cap of keys this Backend holds on it, entries and waiter
// registrations included; a released entry and a registration withdrawn by
// CancelWait no longer count, so a Backend that keeps acquiring and
// releasing, or registering and withdrawing, stays on one session lease.
func TestModesReleaseAndCancelWaitFreeSessionRoom(t *testing.T) {
	t.Cleanup(etcdbackend.SetSessionKeys(2))
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	opts := &etcdbackend.Options{Prefix: prefix}
	b := newBackend(t, newClient(t, nil, nil), opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	var session int64
	// onSession checks that the keys of b under key whose part after it
	// starts with part are on b's first session lease.
	onSession := func(what, key, part string) {
		t.Helper()
		n := 0
		for k, id := range entryLeases(t, ctx, raw, prefix, key) {
			if !strings.HasPrefix(k, key+"\x00"+part) {
				continue
			}
			n++
			if session == 0 {
				session = id
			}
			if id != session {
				t.Fatalf("%s: on lease %x, want the first session lease %x", what, id, session)
			}
		}
		if n != 1 {
			t.Fatalf("%s: got %d keys, want 1", what, n)
		}
	}
	for i := range 3 {
		key := fmt.Sprintf("e%d", i)
		l, err := b.AcquireMode(ctx, modeRequest(key, "h", backend.Exclusive))
		if err != nil {
			t.Fatalf("AcquireMode(%q): %v", key, err)
		}
		onSession(fmt.Sprintf("entry %d, after %d released", i, i), key, "h")
		if err := b.Release(ctx, l); err != nil {
			t.Fatalf("Release(%q): %v", key, err)
		}
	}
	held, err := other.AcquireMode(ctx, modeRequest("w", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(ctx, held)
	for i := range 3 {
		w := modeRequest("w", "waiter", backend.Exclusive)
		w.WaitID = fmt.Sprintf("w%d", i)
		if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
		}
		onSession(fmt.Sprintf("registration %d, after %d withdrawn", i, i), "w", "w")
		if err := b.CancelWait(ctx, "w", w.WaitID); err != nil {
			t.Fatalf("CancelWait: %v", err)
		}
	}
}

// TestModesAcquisitionForgetsItsRegistration: a waiter that acquires the
// key has its registration deleted in the same transaction, and the
// Backend forgets it too: what it remembers of registrations stays bounded
// by the waiters still waiting, however many wait IDs come and go.
func TestModesAcquisitionForgetsItsRegistration(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	for _, fair := range []bool{false, true} {
		held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Exclusive))
		if err != nil {
			t.Fatal(err)
		}
		w := modeRequest("k", "waiter", backend.Exclusive)
		w.WaitID, w.Fair = fmt.Sprintf("fair-%v", fair), fair
		if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("fair %v: AcquireMode of a held key: got %v, want ErrHeld", fair, err)
		}
		if !etcdbackend.KnowsWait(b, "k", w.WaitID) {
			t.Fatalf("fair %v: registration not remembered after ErrHeld", fair)
		}
		if err := other.Release(ctx, held); err != nil {
			t.Fatal(err)
		}
		l, err := b.AcquireMode(ctx, w)
		if err != nil {
			t.Fatalf("fair %v: AcquireMode after the release: %v", fair, err)
		}
		if etcdbackend.KnowsWait(b, "k", w.WaitID) {
			t.Errorf("fair %v: registration still remembered after the waiter acquired", fair)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestModesHoldersSkipEntriesGoneSinceTheRead: Holders returns live
// holders only: an entry whose lease ends after the key's entries were
// read, before its TTL is looked up, is left out rather than reported with
// no TTL.
func TestModesHoldersSkipEntriesGoneSinceTheRead(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	leases := &expiringLease{Lease: cli.Lease}
	cli.Lease = leases
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	var held []backend.Lease
	for _, h := range []string{"a", "b"} {
		req := modeRequest("k", h, backend.Shared)
		req.Detached = true // each on a lease of its own
		l, err := b.AcquireMode(ctx, req)
		if err != nil {
			t.Fatalf("AcquireMode(%q): %v", h, err)
		}
		held = append(held, l)
	}
	leases.mu.Lock()
	leases.end = clientv3.LeaseID(etcdbackend.LeaseOfToken(held[0].Token))
	leases.mu.Unlock()
	recs, err := b.Holders(ctx, "k")
	if err != nil {
		t.Fatalf("Holders: %v", err)
	}
	leases.mu.Lock()
	looked := leases.end == 0
	leases.mu.Unlock()
	if !looked {
		t.Fatal("Holders did not look up the lease of a's entry")
	}
	if len(recs) != 1 || recs[0].HolderID != "b" {
		t.Errorf("Holders with a's lease ended after the read: got %+v, want b alone", recs)
	}
}
