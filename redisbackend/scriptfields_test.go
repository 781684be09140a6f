package redisbackend_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestRecordFieldsFromServer checks the fields of a plain lease's record
// that the scripts compute, by every way of reading it (Get, List, the
// HeldError of another holder's Acquire), with and without metadata (the
// acquire script writes the two cases apart): the field ttl of the lease
// hash is the TTL granted; AcquiredAt, and RenewedAt before any renewal,
// are the server's clock at the acquisition, to the millisecond; TTL is
// what is left of the lease (its PTTL), not the TTL granted. The term
// counter's retention (1 s) is shorter than the lease's TTL, so a
// RenewedAt derived from anything but the granted TTL is out of range.
func TestRecordFieldsFromServer(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{TermRetention: time.Second})
	for _, md := range []map[string]string{nil, {"addr": "10.0.0.1"}} {
		key := "fields-" + strconv.Itoa(len(md))
		t.Run(key, func(t *testing.T) {
			from := serverTime(t, ctx, c)
			if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: 30 * time.Second, Metadata: md}); err != nil {
				t.Fatal(err)
			}
			to := serverTime(t, ctx, c)
			name := "sovereign:{" + key + "}"
			if got := c.HGet(ctx, name, "ttl").Val(); got != "30000" {
				t.Errorf("HGET %s ttl: got %q, want %q (the TTL granted, in ms)", name, got, "30000")
			}
			// Read 20 ms later, so that a time taken when the record is
			// read is out of range too.
			waitServerPast(t, ctx, c, to.Add(20*time.Millisecond))
			lo, hi := from.Truncate(time.Millisecond).Add(-time.Millisecond), to.Add(time.Millisecond)
			for how, rec := range recordsOf(t, ctx, b, key) {
				if rec.AcquiredAt.Before(lo) || rec.AcquiredAt.After(hi) {
					t.Errorf("%s: AcquiredAt %s, want within [%s, %s], the server's clock around the acquisition",
						how, rec.AcquiredAt.Format(time.StampMilli), lo.Format(time.StampMilli), hi.Format(time.StampMilli))
				}
				if rec.RenewedAt.Before(lo) || rec.RenewedAt.After(hi) {
					t.Errorf("%s: RenewedAt %s before any renewal, want within [%s, %s], the server's clock around the acquisition",
						how, rec.RenewedAt.Format(time.StampMilli), lo.Format(time.StampMilli), hi.Format(time.StampMilli))
				}
			}
			// Five seconds left of the lease, as if 25 had passed: every
			// record says so.
			if err := c.PExpire(ctx, name, 5*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			for how, rec := range recordsOf(t, ctx, b, key) {
				if rec.TTL <= 4*time.Second || rec.TTL > 5*time.Second {
					t.Errorf("%s: TTL %v with 5s left of the lease, want in (4s, 5s]", how, rec.TTL)
				}
			}
		})
	}
}

// TestEventPayloads checks the messages on a key's pub/sub channel, which
// the package doc lists for anyone to read (redis-cli SUBSCRIBE):
// "acquired:<term>" at every acquisition and "released:<term>" at every
// release, with the lease's term; for an entry of backend.Modes, on the
// channel of its key and, for the release, of each ancestor; and
// "waiter:cancelled" when CancelWait withdraws a live registration.
func TestEventPayloads(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	sub := c.Subscribe(ctx, "sovereign:{plain}:events", "sovereign:{lock/a}{}:events", "sovereign:{lock/a}{/b}:events")
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the first confirmation
		t.Fatal(err)
	}
	for range 2 {
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	next := func(t *testing.T) *redis.Message {
		t.Helper()
		for {
			v, err := sub.ReceiveTimeout(ctx, 5*time.Second)
			if err != nil {
				t.Fatalf("waiting 5s for the next message: %v", err)
			}
			if m, ok := v.(*redis.Message); ok {
				return m
			}
		}
	}
	expect := func(t *testing.T, channel, payload string) {
		t.Helper()
		if m := next(t); m.Channel != channel || m.Payload != payload {
			t.Errorf("message: got %q on %q, want %q on %q", m.Payload, m.Channel, payload, channel)
		}
	}

	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "plain", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	term := strconv.FormatUint(l.Term, 10)
	expect(t, "sovereign:{plain}:events", "acquired:"+term)
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	expect(t, "sovereign:{plain}:events", "released:"+term)

	e, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/a/b", HolderID: "a", TTL: time.Minute},
		Mode:           backend.Exclusive, Ancestors: []string{"lock/a"}})
	if err != nil {
		t.Fatal(err)
	}
	term = strconv.FormatUint(e.Term, 10)
	expect(t, "sovereign:{lock/a}{/b}:events", "acquired:"+term)
	if err := b.Release(ctx, e); err != nil {
		t.Fatal(err)
	}
	expect(t, "sovereign:{lock/a}{/b}:events", "released:"+term)
	expect(t, "sovereign:{lock/a}{}:events", "released:"+term)

	// CancelWait of a live registration publishes a change; of one that is
	// gone, nothing (the next message is the release).
	h, err := b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "lock/a/b", HolderID: "a", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "sovereign:{lock/a}{/b}:events", "acquired:"+strconv.FormatUint(h.Term, 10))
	_, err = b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "lock/a/b", HolderID: "w", TTL: time.Minute},
		Fair: true, WaitID: "wait-w"})
	if !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	for range 2 {
		if err := b.CancelWait(ctx, "lock/a/b", "wait-w"); err != nil {
			t.Fatal(err)
		}
	}
	expect(t, "sovereign:{lock/a}{/b}:events", "waiter:cancelled")
	if err := b.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	expect(t, "sovereign:{lock/a}{/b}:events", "released:"+strconv.FormatUint(h.Term, 10))
}

// TestTermsAboveCounter: a new term is the counter plus one when the
// counter is ahead of the server's clock (as after the clock was stepped
// back while the counter existed), for a plain Acquire and for each mode of
// AcquireMode, and the counter is written back with TermRetention as its
// expiry.
func TestTermsAboveCounter(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	const retention = 5 * time.Second
	b := newBackend(t, c, &redisbackend.Options{TermRetention: retention})
	acquires := []struct {
		key     string
		acquire func() (backend.Lease, error)
	}{
		{"plain", func() (backend.Lease, error) {
			return b.Acquire(ctx, backend.AcquireRequest{Key: "plain", HolderID: "a", TTL: time.Minute})
		}},
		{"lock/x", func() (backend.Lease, error) {
			return b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "lock/x", HolderID: "a", TTL: time.Minute}})
		}},
		{"lock/s", func() (backend.Lease, error) {
			return b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "lock/s", HolderID: "a", TTL: time.Minute},
				Mode: backend.Shared})
		}},
	}
	for _, a := range acquires {
		t.Run(a.key, func(t *testing.T) {
			name := "sovereign:{" + a.key + "}:term"
			if a.key != "plain" {
				name = "sovereign:{" + a.key + "}{}:term"
			}
			// An hour of microseconds ahead of the server's clock.
			counter := uint64(serverTime(t, ctx, c).Add(time.Hour).UnixMicro())
			if err := c.Set(ctx, name, strconv.FormatUint(counter, 10), 0).Err(); err != nil {
				t.Fatal(err)
			}
			l, err := a.acquire()
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if l.Term != counter+1 {
				t.Errorf("term: got %d, want %d (the counter plus one, ahead of the clock)", l.Term, counter+1)
			}
			if got, want := c.Get(ctx, name).Val(), strconv.FormatUint(l.Term, 10); got != want {
				t.Errorf("GET %s: got %q, want %q", name, got, want)
			}
			if pttl := c.PTTL(ctx, name).Val(); pttl <= 0 || pttl > retention {
				t.Errorf("PTTL %s: got %v, want in (0, %v] (TermRetention)", name, pttl, retention)
			}
		})
	}
}

// TestEntryRenewedAt: an entry of backend.Modes keeps the time of its last
// renewal (the field r of the entry, not derived from an expiry): after a
// Renew, every record of it says it was renewed then, by the server's
// clock.
func TestEntryRenewedAt(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	const key = "lock/renewed"
	from := serverTime(t, ctx, c)
	l, err := b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: key, HolderID: "a", TTL: 30 * time.Second},
		Mode: backend.Shared})
	if err != nil {
		t.Fatal(err)
	}
	to := serverTime(t, ctx, c)
	waitServerPast(t, ctx, c, to.Add(20*time.Millisecond))
	checkRenewedAt(t, ctx, b, key, from, to)

	from = serverTime(t, ctx, c)
	if err := b.Renew(ctx, l); err != nil {
		t.Fatal(err)
	}
	to = serverTime(t, ctx, c)
	waitServerPast(t, ctx, c, to.Add(20*time.Millisecond))
	checkRenewedAt(t, ctx, b, key, from, to)
}

// TestBadTermRefused: a lease hash whose term is not a positive integer
// (written by hand or by another program) is never read as a record: Get
// and a competing Acquire or AcquireMode fail with ErrWrongType, as on
// other foreign data, rather than report a holder with term 0, which a
// downstream store would take for a term below every real one.
func TestBadTermRefused(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "bt:"})
	for _, term := range []string{"0", "-3"} {
		t.Run(term, func(t *testing.T) {
			if err := c.HSet(ctx, "bt:{k}", "holder", "x", "token", "t", "term", term, "acquired_at", 1, "ttl", 60000).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.PExpire(ctx, "bt:{k}", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			// Each call fails as on other foreign data at our path
			// (ErrWrongType), and says what it found.
			if r, err := b.Get(ctx, "k"); !errors.Is(err, redisbackend.ErrWrongType) || !strings.Contains(err.Error(), "the term "+term) {
				t.Errorf("Get: got record with term %d, error %v; want ErrWrongType naming the term", r.Term, err)
			}
			_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "y", TTL: time.Minute})
			var held *backend.HeldError
			if !errors.Is(err, redisbackend.ErrWrongType) || errors.As(err, &held) {
				t.Errorf("Acquire: got %v, want ErrWrongType, not a HeldError", err)
			}
			_, err = b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "k", HolderID: "y", TTL: time.Minute}, Mode: backend.Shared, Limit: 2})
			if !errors.Is(err, redisbackend.ErrWrongType) || errors.As(err, &held) {
				t.Errorf("AcquireMode: got %v, want ErrWrongType, not a HeldError", err)
			}
			if got := c.HGet(ctx, "bt:{k}", "term").Val(); got != term {
				t.Errorf("term field after the calls: got %q, want %q untouched", got, term)
			}
			// List skips it, as it skips data of another kind, and still
			// lists the leases beside it.
			l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "ok", HolderID: "y", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = b.Release(ctx, l) }()
			recs, err := b.List(ctx, "")
			if err != nil || len(recs) != 1 || recs[0].Key != "ok" {
				t.Errorf("List: got %v, %v; want only the lease of %q", recs, err, "ok")
			}
		})
	}
}
