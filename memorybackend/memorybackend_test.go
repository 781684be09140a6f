package memorybackend_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func acquire(t *testing.T, b backend.Backend, key, id string, ttl time.Duration) backend.Lease {
	t.Helper()
	l, err := b.Acquire(t.Context(), backend.AcquireRequest{Key: key, HolderID: id, TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire(%q, %q): got error %v, want nil", key, id, err)
	}
	return l
}

// pending returns the events buffered on ch without blocking.
func pending(ch <-chan backend.Event) []backend.EventType {
	var got []backend.EventType
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return got
			}
			got = append(got, e.Type)
		default:
			return got
		}
	}
}

func TestExpiryInVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, w := store.Client(), store.Client()
		defer a.Close()
		defer w.Close()
		ctx := t.Context()
		events, err := w.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		l := acquire(t, a, "k", "a", time.Second)
		synctest.Wait()
		if got := pending(events); len(got) != 1 || got[0] != backend.EventChanged {
			t.Fatalf("events after acquire: got %v, want [changed]", got)
		}

		time.Sleep(999 * time.Millisecond)
		rec, err := w.Get(ctx, "k")
		if err != nil {
			t.Fatalf("Get before expiry: got %v, want nil", err)
		}
		if rec.TTL != time.Millisecond {
			t.Fatalf("TTL before expiry: got %v, want 1ms", rec.TTL)
		}

		// The expiry timer delivers the event without anybody touching the key.
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := pending(events); len(got) != 1 || got[0] != backend.EventExpired {
			t.Fatalf("events at expiry: got %v, want [expired]", got)
		}
		if _, err := w.Get(ctx, "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("Get after expiry: got %v, want ErrNotHeld", err)
		}
		if err := a.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Fatalf("Renew after expiry: got %v, want ErrLeaseLost", err)
		}
		l2 := acquire(t, w, "k", "w", time.Second)
		if l2.Term <= l.Term {
			t.Fatalf("term after expiry: got %d, want > %d", l2.Term, l.Term)
		}
	})
}

func TestRenewMovesExpiryTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memorybackend.New()
		defer b.Close()
		ctx := t.Context()
		events, err := b.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		l := acquire(t, b, "k", "a", time.Second)
		time.Sleep(800 * time.Millisecond)
		if err := b.Renew(ctx, l); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		time.Sleep(900 * time.Millisecond) // 1.7 s after acquire, 0.9 s after renew
		synctest.Wait()
		if got := pending(events); len(got) != 1 || got[0] != backend.EventChanged {
			t.Fatalf("events before renewed expiry: got %v, want [changed]", got)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if got := pending(events); len(got) != 1 || got[0] != backend.EventExpired {
			t.Fatalf("events at renewed expiry: got %v, want [expired]", got)
		}

		// A renewal with a shorter TTL brings the expiry forward.
		l = acquire(t, b, "k", "a", time.Hour)
		l.TTL = time.Second
		if err := b.Renew(ctx, l); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := pending(events); len(got) != 2 || got[1] != backend.EventExpired {
			t.Fatalf("events after shortened renew: got %v, want [changed expired]", got)
		}
	})
}

func TestPartition(t *testing.T) {
	store := memorybackend.NewStore()
	a, b := store.Client(), store.Client()
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	events, err := a.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}

	a.Partition()
	calls := map[string]func() error{
		"Acquire": func() error {
			_, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Second})
			return err
		},
		"Get":       func() error { _, err := a.Get(ctx, "k"); return err },
		"Heartbeat": func() error { return a.Heartbeat(ctx, "k", "a", time.Second) },
		"Watch":     func() error { _, err := a.Watch(ctx, "k"); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, memorybackend.ErrPartitioned) {
			t.Errorf("%s while partitioned: got %v, want ErrPartitioned", name, err)
		}
	}

	// The other client works, and the partitioned one hears nothing of it.
	lb := acquire(t, b, "k", "b", time.Minute)
	if err := b.Release(ctx, lb); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := pending(events); len(got) != 0 {
		t.Fatalf("events while partitioned: got %v, want none", got)
	}

	a.Heal()
	if got := pending(events); len(got) != 1 || got[0] != backend.EventChanged {
		t.Fatalf("events after Heal: got %v, want [changed]", got)
	}
	acquire(t, a, "k", "a", time.Minute)
	if got := pending(events); len(got) != 1 || got[0] != backend.EventChanged {
		t.Fatalf("events after healed acquire: got %v, want [changed]", got)
	}
}

func TestHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := memorybackend.New()
		defer a.Close()
		a.Hang()

		// A hung call returns when its context ends, and not before.
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := a.Get(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("hung Get: got %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 3*time.Second {
			t.Fatalf("hung Get returned after %v, want 3s", d)
		}

		// Heal lets a hung call proceed; Close makes it fail with ErrClosed.
		results := make(chan error, 1)
		go func() {
			_, err := a.Acquire(t.Context(), backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Second})
			results <- err
		}()
		synctest.Wait()
		select {
		case err := <-results:
			t.Fatalf("hung Acquire returned %v before Heal", err)
		default:
		}
		a.Heal()
		if err := <-results; err != nil {
			t.Fatalf("Acquire after Heal: got %v, want nil", err)
		}

		a.Hang()
		go func() {
			_, err := a.Members(t.Context(), "k")
			results <- err
		}()
		synctest.Wait()
		a.Close()
		if err := <-results; !errors.Is(err, backend.ErrClosed) {
			t.Fatalf("hung Members after Close: got %v, want ErrClosed", err)
		}
	})
}

func TestHangWithholdsEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b := store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		events, err := a.Watch(t.Context(), "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		a.Hang()
		acquire(t, b, "k", "b", time.Second)
		time.Sleep(2 * time.Second) // the lease expires
		synctest.Wait()
		if got := pending(events); len(got) != 0 {
			t.Fatalf("events while hung: got %v, want none", got)
		}
		a.Heal()
		if got := pending(events); len(got) != 1 || got[0] != backend.EventChanged {
			t.Fatalf("events after Heal: got %v, want [changed]", got)
		}
	})
}

func TestLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b := store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		a.SetLatency(100 * time.Millisecond)

		start := time.Now()
		l := acquire(t, a, "k", "a", time.Second)
		if d := time.Since(start); d != 100*time.Millisecond {
			t.Fatalf("Acquire with latency took %v, want 100ms", d)
		}
		// The operation happens after the latency: the lease has its full TTL.
		rec, err := b.Get(t.Context(), "k")
		if err != nil || rec.TTL != time.Second {
			t.Fatalf("Get: got TTL %v, error %v; want 1s, nil", rec.TTL, err)
		}

		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if err := a.Renew(ctx, l); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Renew with deadline below latency: got %v, want DeadlineExceeded", err)
		}

		a.Heal()
		start = time.Now()
		if err := a.Renew(t.Context(), l); err != nil {
			t.Fatalf("Renew after Heal: %v", err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("Renew after Heal took %v, want 0", d)
		}
	})
}

func TestCalls(t *testing.T) {
	store := memorybackend.NewStore()
	a, b := store.Client(), store.Client()
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	l := acquire(t, a, "k", "a", time.Minute)
	for range 3 {
		if err := a.Renew(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := a.SetMetadata(ctx, l, map[string]string{"x": "y"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.List(ctx, ""); err != nil {
		t.Fatal(err)
	}
	a.Partition()
	_ = a.Release(ctx, l) // counted although it fails
	_, _ = a.List(ctx, "")
	_ = a.ValidateKey("k") // counted, though it does no I/O and ignores faults
	a.MinTTL()
	a.MinTTL()
	got := a.Calls()
	want := map[string]int64{"Acquire": 1, "Renew": 3, "Release": 1, "SetMetadata": 1, "List": 2, "ValidateKey": 1, "MinTTL": 2}
	if len(got) != len(want) {
		t.Fatalf("Calls: got %v, want %v", got, want)
	}
	for op, n := range want {
		if got[op] != n {
			t.Errorf("Calls()[%q]: got %d, want %d", op, got[op], n)
		}
	}
	if got := b.Calls()["Get"]; got != 1 {
		t.Errorf(`b.Calls()["Get"]: got %d, want 1`, got)
	}
	a.ResetCalls()
	if got := a.Calls(); len(got) != 0 {
		t.Errorf("Calls after ResetCalls: got %v, want empty", got)
	}
}

func TestCloseClosesWatches(t *testing.T) {
	b := memorybackend.New()
	events, err := b.Watch(context.Background(), "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: got %v, want nil", err)
	}
	if _, ok := <-events; ok {
		t.Fatal("watch channel open after Close")
	}
	if _, err := b.Watch(context.Background(), "k"); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Watch after Close: got %v, want ErrClosed", err)
	}
}

// A watch tells a release from an expiry, and reports neither a renewal nor
// SetMetadata (the package doc's Watch section).
func TestWatchEventKinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, w := store.Client(), store.Client()
		defer a.Close()
		defer w.Close()
		ctx := t.Context()
		events, err := w.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		l := acquire(t, a, "k", "a", time.Second)
		if err := a.Renew(ctx, l); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if err := a.SetMetadata(ctx, l, map[string]string{"x": "y"}); err != nil {
			t.Fatalf("SetMetadata: %v", err)
		}
		if got := pending(events); !slices.Equal(got, []backend.EventType{backend.EventChanged}) {
			t.Fatalf("events after acquire, renew and SetMetadata: got %v, want [changed]", got)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got := pending(events); !slices.Equal(got, []backend.EventType{backend.EventReleased}) {
			t.Fatalf("events after release: got %v, want [released]", got)
		}
		acquire(t, a, "k", "a", time.Second)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := pending(events); !slices.Equal(got, []backend.EventType{backend.EventChanged, backend.EventExpired}) {
			t.Fatalf("events after acquire and expiry: got %v, want [changed expired]", got)
		}
	})
}

// Metadata is copied in and out: changing a map after passing it to
// Acquire, AcquireMode or SetMetadata, or the metadata of a record read from
// the store, changes neither the store nor later records.
func TestMetadataIsCopied(t *testing.T) {
	store := memorybackend.NewStore()
	a, b := store.Client(), store.Client()
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	given := map[string]string{"v": "1"}
	plain := backend.AcquireRequest{Key: "plain", HolderID: "a", TTL: time.Minute, Metadata: given}
	if _, err := a.Acquire(ctx, plain); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	entry := modeReq("entry", "a", backend.Shared, time.Minute)
	entry.Metadata = given
	acquireMode(t, a, entry)
	set := map[string]string{"v": "1"}
	plain.Key = "plain-set"
	lp, err := a.Acquire(ctx, plain)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	entry.Key = "entry-set"
	le := acquireMode(t, a, entry)
	for _, l := range []backend.Lease{lp, le} {
		if err := a.SetMetadata(ctx, l, set); err != nil {
			t.Fatalf("SetMetadata(%q): %v", l.Key, err)
		}
	}
	given["v"] = "changed by the caller after Acquire"
	set["v"] = "changed by the caller after SetMetadata"
	keys := []string{"plain", "entry", "plain-set", "entry-set"}

	// Each read returns the records of every key.
	reads := map[string]func() []backend.Record{
		"Get": func() (recs []backend.Record) {
			for _, k := range keys {
				rec, err := b.Get(ctx, k)
				if err != nil {
					t.Fatalf("Get(%q): %v", k, err)
				}
				recs = append(recs, rec)
			}
			return recs
		},
		"List": func() []backend.Record {
			recs, err := b.List(ctx, "")
			if err != nil || len(recs) != len(keys) {
				t.Fatalf("List: got %d records, error %v; want %d", len(recs), err, len(keys))
			}
			return recs
		},
		"Holders": func() (recs []backend.Record) {
			for _, k := range keys {
				hs, err := b.Holders(ctx, k)
				if err != nil || len(hs) != 1 {
					t.Fatalf("Holders(%q): got %v, %v; want one record", k, hs, err)
				}
				recs = append(recs, hs...)
			}
			return recs
		},
		"HeldError": func() (recs []backend.Record) {
			for _, k := range keys {
				_, err := b.Acquire(ctx, backend.AcquireRequest{Key: k, HolderID: "b", TTL: time.Minute})
				var held *backend.HeldError
				if !errors.As(err, &held) {
					t.Fatalf("Acquire(%q) of a held key: got %v, want *HeldError", k, err)
				}
				recs = append(recs, held.Holder)
			}
			return recs
		},
	}
	for name, read := range reads {
		for _, rec := range read() {
			if got := rec.Metadata["v"]; got != "1" {
				t.Errorf("%s: metadata of %q after the caller changed the map it passed: got %q, want %q", name, rec.Key, got, "1")
			}
		}
	}
	for name, read := range reads {
		for _, rec := range read() {
			rec.Metadata["v"] = "scribbled on a record from " + name
		}
	}
	for name, read := range reads {
		for _, rec := range read() {
			if got := rec.Metadata["v"]; got != "1" {
				t.Errorf("%s: metadata of %q after the caller changed an earlier record: got %q, want %q", name, rec.Key, got, "1")
			}
		}
	}
}

// A fault set while a call waits out its latency applies to that call: it
// fails and never reaches the store.
func TestFaultDuringLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b := store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		a.SetLatency(time.Second)
		results := make(chan error, 1)
		go func() {
			_, err := a.Acquire(t.Context(), backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
			results <- err
		}()
		synctest.Wait() // the Acquire waits out its latency
		a.Partition()
		if err := <-results; !errors.Is(err, memorybackend.ErrPartitioned) {
			t.Fatalf("Acquire partitioned during its latency: got %v, want ErrPartitioned", err)
		}
		if _, err := b.Get(t.Context(), "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("Get after the partitioned Acquire: got %v, want ErrNotHeld", err)
		}
	})
}

// List applies expiry as Get does: a holder whose heartbeat record expired
// is listed without a heartbeat, although nothing else touched the key (its
// expiry timer waits for the lease).
func TestListAppliesExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b := store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		ctx := t.Context()
		acquire(t, a, "k", "a", time.Hour)
		if err := a.Heartbeat(ctx, "k", "a", time.Second); err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}
		recs, err := b.List(ctx, "")
		if err != nil || len(recs) != 1 || !recs[0].HasHeartbeat() {
			t.Fatalf("List with a live heartbeat: got %+v, %v; want one record with its heartbeat", recs, err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		recs, err = b.List(ctx, "")
		if err != nil || len(recs) != 1 || recs[0].HasHeartbeat() {
			t.Fatalf("List once the heartbeat expired: got %+v, %v; want one record without a heartbeat", recs, err)
		}
	})
}

// A watch buffers 16 events and drops the rest without ever blocking the
// store, and WatchNotify calls notify for every event, sent or dropped.
func TestWatchBufferFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, w := store.Client(), store.Client()
		defer a.Close()
		defer w.Close()
		ctx := t.Context()
		events, err := w.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		var notified atomic.Int64
		notifying, err := w.WatchNotify(ctx, "k", func() { notified.Add(1) })
		if err != nil {
			t.Fatalf("WatchNotify: %v", err)
		}
		const cycles = 20 // 40 events, nobody reading
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range cycles {
				if err := a.Release(ctx, acquire(t, a, "k", "a", time.Minute)); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		}()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("acquisitions and releases with full watch buffers still blocked after a minute")
			for { // unblock the store, so that the bubble can end
				select {
				case <-events:
				case <-notifying:
				case <-done:
					t.FailNow()
				}
			}
		}
		for name, ch := range map[string]<-chan backend.Event{"Watch": events, "WatchNotify": notifying} {
			if got := pending(ch); len(got) != 16 || got[0] != backend.EventChanged || got[1] != backend.EventReleased {
				t.Errorf("%s: events buffered: got %v, want the first 16 ([changed released ...])", name, got)
			}
		}
		if got := notified.Load(); got != 2*cycles {
			t.Errorf("notify calls: got %d, want %d (one per event, sent or dropped)", got, 2*cycles)
		}
	})
}

// Partition makes a call blocked by Hang fail at once.
func TestPartitionEndsHungCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := memorybackend.New()
		defer a.Close()
		a.Hang()
		results := make(chan error, 1)
		go func() {
			_, err := a.Get(t.Context(), "k")
			results <- err
		}()
		synctest.Wait()
		a.Partition()
		if err := <-results; !errors.Is(err, memorybackend.ErrPartitioned) {
			t.Fatalf("hung Get after Partition: got %v, want ErrPartitioned", err)
		}
	})
}
