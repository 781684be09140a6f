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
// "renewed:<term>:<ttl ms>" on the key's renewals channel, Acquire on its
// events channel (the format and channels the godoc names; the payload is
// the one every renewal-aware version parses): the conformance case
// WatchRenewals checks what WatchRenewals makes of it, which a consistent
// change of both the scripts and the parser would keep, not the wire
// format itself.
func TestSurveyRenewalPayload(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	const events, renewals = "sovereign:{renewed}:events", "sovereign:{renewed}:renewals"
	sub := c.Subscribe(ctx, events, renewals)
	t.Cleanup(func() { _ = sub.Close() })
	for range 2 {
		if _, err := sub.Receive(ctx); err != nil { // the confirmations
			t.Fatal(err)
		}
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
		return m.Channel + " " + m.Payload
	}
	term := strconv.FormatUint(l.Term, 10)
	if got, want := next("Acquire"), events+" acquired:"+term; got != want {
		t.Errorf("Acquire: got %q, want %q", got, want)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Fatal(err)
	}
	if got, want := next("Renew"), renewals+" renewed:"+term+":1500"; got != want {
		t.Errorf("Renew: got %q, want %q", got, want)
	}
	if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got, want := next("RenewBatch"), renewals+" renewed:"+term+":1500"; got != want {
		t.Errorf("RenewBatch: got %q, want %q", got, want)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if got, want := next("Release"), events+" released:"+term; got != want {
		t.Errorf("Release: got %q, want %q", got, want)
	}
}

// TestSurveyPubSubOffRenewals: with PubSubOff, Renew and RenewBatch renew
// and publish nothing (TestPubSubOff covers the other operations): the
// first message a subscriber of the key's channels gets is the one of a
// later Acquire through a backend that publishes.
func TestSurveyPubSubOffRenewals(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	off := newBackend(t, c, &redisbackend.Options{PubSub: redisbackend.PubSubOff})
	sub := c.Subscribe(ctx, "sovereign:{renewed-off}:events", "sovereign:{renewed-off}:renewals")
	t.Cleanup(func() { _ = sub.Close() })
	for range 2 {
		if _, err := sub.Receive(ctx); err != nil { // the confirmations
			t.Fatal(err)
		}
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

// TestSurveyEntryRenewalChannels: the renewal of an entry of backend.Modes
// is published on the renewals channel of its key and of each ancestor,
// and nothing of it on their events channels, where its acquisition (on
// the key's) and its release (on both) are published.
func TestSurveyEntryRenewalChannels(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	const (
		keyEvents, keyRenewals = "sovereign:{lock/p}{/q}:events", "sovereign:{lock/p}{/q}:renewals"
		ancEvents, ancRenewals = "sovereign:{lock/p}{}:events", "sovereign:{lock/p}{}:renewals"
	)
	sub := c.Subscribe(ctx, keyEvents, keyRenewals, ancEvents, ancRenewals)
	t.Cleanup(func() { _ = sub.Close() })
	for range 4 {
		if _, err := sub.Receive(ctx); err != nil { // the confirmations
			t.Fatal(err)
		}
	}
	l, err := b.AcquireMode(ctx, backend.ModeRequest{Mode: backend.Shared, Ancestors: []string{"lock/p"},
		AcquireRequest: backend.AcquireRequest{Key: "lock/p/q", HolderID: "a", TTL: 1500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	term := strconv.FormatUint(l.Term, 10)
	got := map[string]bool{}
	for range 5 { // the acquisition, the renewal on two channels, the release on two
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("waiting for the next message (got %v): %v", got, err)
		}
		got[m.Channel+" "+m.Payload] = true
	}
	for _, want := range []string{
		keyEvents + " acquired:" + term, keyRenewals + " renewed:" + term + ":1500", ancRenewals + " renewed:" + term + ":1500",
		keyEvents + " released:" + term, ancEvents + " released:" + term,
	} {
		if !got[want] {
			t.Errorf("messages %v: no %q", got, want)
		}
	}
}
