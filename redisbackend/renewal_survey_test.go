package redisbackend_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestSurveyRenewalPayload: Renew and RenewBatch publish
// "renewed:<term>:<ttl ms>" on the key's channel (the format the godoc
// names, which every renewal-aware version parses): the conformance case
// WatchRenewals checks what WatchRenewals makes of it, which a consistent
// change of both the scripts and the parser would keep, not the wire
// format itself.
func TestSurveyRenewalPayload(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	sub := c.Subscribe(ctx, "sovereign:{renewed}:events")
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "renewed", HolderID: "a", TTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) string {
		t.Helper()
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("%s: waiting for the next message: %v", what, err)
		}
		return m.Payload
	}
	term := strconv.FormatUint(l.Term, 10)
	if got, want := next("Acquire"), "acquired:"+term; got != want {
		t.Errorf("Acquire: got %q, want %q", got, want)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Fatal(err)
	}
	if got, want := next("Renew"), "renewed:"+term+":1500"; got != want {
		t.Errorf("Renew: got %q, want %q", got, want)
	}
	if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got, want := next("RenewBatch"), "renewed:"+term+":1500"; got != want {
		t.Errorf("RenewBatch: got %q, want %q", got, want)
	}
}

// TestSurveyPubSubOffRenewals: with PubSubOff, Renew and RenewBatch renew
// and publish nothing (TestPubSubOff covers the other operations): the
// first message a subscriber of the key's channel gets is the one of a
// later Acquire through a backend that publishes.
func TestSurveyPubSubOffRenewals(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	off := newBackend(t, c, &redisbackend.Options{PubSub: redisbackend.PubSubOff})
	sub := c.Subscribe(ctx, "sovereign:{renewed-off}:events")
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	l, err := off.Acquire(ctx, backend.AcquireRequest{Key: "renewed-off", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.Renew(ctx, l); err != nil {
		t.Fatalf("Renew with PubSubOff: %v", err)
	}
	if errs := off.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
		t.Fatalf("RenewBatch with PubSubOff: %v", errs[0])
	}
	if err := off.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	on := newBackend(t, c, nil)
	l, err = on.Acquire(ctx, backend.AcquireRequest{Key: "renewed-off", HolderID: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	m, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "acquired:" + strconv.FormatUint(l.Term, 10); m.Payload != want {
		t.Errorf("first message: got %q, want %q (nothing from the renewals with PubSubOff)", m.Payload, want)
	}
}
