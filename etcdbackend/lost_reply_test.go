package etcdbackend_test

import (
	"context"
	"errors"
	"path"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// TestAcquireWithLostReply: an acquisition whose transaction committed but
// whose reply was lost (its outcome unknown to the caller, who gives the
// key up) does not leave the key held by nobody: a Detached acquisition
// revokes its grant before it returns, freeing the key at once, and an
// acquisition on a session deletes its record in the background, well
// before the session (kept for a minute) would end it. (Mutations skipping
// either survived every test.)
func TestAcquireWithLostReply(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	// Set: the reply of the next transaction of b is lost (the transaction
	// reached the store and committed).
	var loseReply atomic.Bool
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if path.Base(method) == "Txn" && err == nil && loseReply.CompareAndSwap(true, false) {
					return status.Error(codes.Unknown, "test: reply lost")
				}
				return err
			}))
	})
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	held := func(key string) bool {
		t.Helper()
		resp, err := raw.Get(ctx, prefix+key, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count == 1
	}
	// A session for the TTL, with a key of its own that keeps it alive.
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "kept", HolderID: "a", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}

	for _, detached := range []bool{true, false} {
		key := map[bool]string{true: "detached", false: "on-session"}[detached]
		loseReply.Store(true)
		_, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute, Detached: detached})
		var he *backend.HeldError
		if err == nil || errors.As(err, &he) {
			t.Fatalf("Acquire(%q) with its reply lost: got %v, want a failure", key, err)
		}
		if loseReply.Load() {
			t.Fatalf("Acquire(%q) sent no transaction", key)
		}
		if detached {
			if held(key) {
				t.Errorf("Acquire(%q) failed with its reply lost, and its key is still held", key)
			}
			continue
		}
		electortest.Eventually(t, "the record of an acquisition whose reply was lost deleted", func() bool {
			return !held(key)
		})
	}
}
