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

// TestAcquireWithLostReply: an acquisition sent to a server that stalls
// (SIGSTOP) times out at the caller, and the server runs it when it
// resumes: the key is then held under the caller's holder ID with a token
// no caller has. Other Backends see it held, as they must (even one with
// the same holder ID: ownership is the token); the Backend that sent it
// knows the token, so its next acquisition of the key deletes that lease
// and takes the key at once, with a greater term, instead of waiting out
// the TTL (an election without a leader for one more TTL after the store
// came back, found by an operator trial).
func TestAcquireWithLostReply(t *testing.T) {
	srv := testredis.Start(t)
	ctx := ctxBound(t)
	b := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: "lr:"})
	other := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: "lr:"})
	twin := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: "lr:"})
	// Connections up and the script loaded before the stall, so that the
	// script is written to the server's socket rather than stuck in a
	// handshake, and runs (EVALSHA) rather than failing with NOSCRIPT.
	for _, x := range []*redisbackend.Backend{b, other, twin} {
		l, err := x.Acquire(ctx, backend.AcquireRequest{Key: "warm", HolderID: "w", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}

	srv.Pause(t)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := b.Acquire(short, req)
	cancel()
	srv.Resume(t)
	if err == nil || errors.As(err, new(*backend.HeldError)) {
		t.Fatalf("Acquire while the server is stopped: got %v, want a timeout", err)
	}
	var lost backend.Record
	eventually(t, "the stalled acquisition runs once the server resumes", func() bool {
		rec, err := other.Get(ctx, "k")
		lost = rec
		return err == nil
	})
	if lost.HolderID != "a" {
		t.Fatalf("key after the stall: held by %q, want a (the lost acquisition)", lost.HolderID)
	}

	var held *backend.HeldError
	if _, err := other.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Minute}); !errors.As(err, &held) {
		t.Fatalf("another holder's Acquire: got %v, want HeldError", err)
	}
	if _, err := twin.Acquire(ctx, req); !errors.As(err, &held) {
		t.Fatalf("Acquire by another Backend with the same holder ID: got %v, want HeldError (it does not have the token)", err)
	}

	l, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire by the Backend whose reply was lost: %v, want the key at once", err)
	}
	if l.Term <= lost.Term {
		t.Errorf("term after taking the key back: %d, want above the lost acquisition's %d", l.Term, lost.Term)
	}
	rec, err := other.Get(ctx, "k")
	if err != nil || rec.Term != l.Term {
		t.Fatalf("record after taking the key back: %+v, %v; want term %d", rec, err, l.Term)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
