package redisbackend_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
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
