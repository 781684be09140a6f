package etcdbackend_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestDetachedReleaseDeletesOnly: the Release of a Detached lease deletes
// its record and writes nothing (no release marker), and a watcher still
// reports it as a release, not an expiry, though the revocation that
// follows deletes the lease's lease mark.
func TestDetachedReleaseDeletesOnly(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	w := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	events, err := w.Watch(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "d", HolderID: "a", TTL: time.Minute, Detached: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := nextNonReset(t, events, "acquisition"); e.Type != backend.EventChanged {
		t.Fatalf("acquisition: got %v, want %v", e.Type, backend.EventChanged)
	}
	// Every change under the prefix from the release on.
	start, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if e := nextNonReset(t, events, "release"); e.Type != backend.EventReleased {
		t.Fatalf("release: got %v, want %v", e.Type, backend.EventReleased)
	}
	end, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if end.Count != 0 {
		t.Errorf("after Release: %d keys left under the prefix, want 0", end.Count)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wc := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(start.Header.Revision+1))
	var puts, deletes int
	for deletes+puts < 2 {
		select {
		case resp := <-wc:
			if err := resp.Err(); err != nil {
				t.Fatal(err)
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > end.Header.Revision {
					continue
				}
				if ev.Type == mvccpb.PUT {
					puts++
					t.Errorf("Release put %q", ev.Kv.Key)
				} else {
					deletes++
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("after 10 s: %d puts and %d deletions seen, want the record's and the lease mark's deletions", puts, deletes)
		}
	}
}

// TestEntryReleaseDeletesOnly: the Release of an entry of backend.Modes
// with ancestors, on a session or Detached, deletes the entry and its
// intents and puts nothing (no release markers), and watchers of the key
// and of each ancestor still report a release, not an expiry.
func TestEntryReleaseDeletesOnly(t *testing.T) {
	for _, detached := range []bool{false, true} {
		t.Run(fmt.Sprintf("detached=%v", detached), func(t *testing.T) {
			ctx := testCtx(t)
			prefix := newPrefix()
			cli := newClient(t, nil, nil)
			b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
			w := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
			keys := []string{"t", "t/a", "t/a/b"}
			var subs []<-chan backend.Event
			for _, k := range keys {
				ch, err := w.Watch(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				subs = append(subs, ch)
			}
			req := modeRequest("t/a/b", "a", backend.Exclusive)
			req.Ancestors = keys[:2]
			req.Detached = detached
			l, err := b.AcquireMode(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for i, ch := range subs {
				if e := nextNonReset(t, ch, "acquisition"); e.Type != backend.EventChanged {
					t.Fatalf("acquisition, watcher of %q: got %v, want %v", keys[i], e.Type, backend.EventChanged)
				}
			}
			start, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Release(ctx, l); err != nil {
				t.Fatalf("Release: %v", err)
			}
			for i, ch := range subs {
				if e := nextNonReset(t, ch, "release"); e.Type != backend.EventReleased {
					t.Fatalf("release, watcher of %q: got %v, want %v", keys[i], e.Type, backend.EventReleased)
				}
			}
			end, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range putsBetween(t, cli, prefix, start.Header.Revision, end.Header.Revision) {
				t.Errorf("Release put %q", k)
			}
		})
	}
}

// putsBetween returns the keys under prefix put after revision from, up to
// revision to (the store's revision after the changes looked at).
func putsBetween(t *testing.T, cli *clientv3.Client, prefix string, from, to int64) []string {
	t.Helper()
	if to <= from {
		return nil
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	wc := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1))
	var puts []string
	for {
		select {
		case resp, ok := <-wc:
			if !ok {
				t.Fatal("watch closed")
			}
			if err := resp.Err(); err != nil {
				t.Fatal(err)
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > to {
					return puts
				}
				if ev.Type == mvccpb.PUT {
					puts = append(puts, string(ev.Kv.Key))
				}
			}
			if n := len(resp.Events); n > 0 && resp.Events[n-1].Kv.ModRevision >= to {
				return puts
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no change up to revision %d seen within 10 s", to)
		}
	}
}
