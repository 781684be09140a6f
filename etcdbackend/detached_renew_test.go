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

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestDetachedRenewFindsLeaseGone: a Renew of a Detached lease, plain or an
// entry of backend.Modes, whose etcd lease ends between its owner check and
// its keep-alive reports backend.ErrLeaseLost (the keep-alive finds the
// lease gone), not a failure to reach the store, which a caller would
// retry until its deadline. The lease is revoked right after the owner
// check's reply, so the test does not depend on timing. (A mutation
// reporting that keep-alive as a plain failure survived every test.)
func TestDetachedRenewFindsLeaseGone(t *testing.T) {
	ctx := testCtx(t)
	raw := newClient(t, nil, nil)
	// The etcd lease to revoke once the next transaction of b has returned.
	var revoke atomic.Int64
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if path.Base(method) == "Txn" {
					if id := revoke.Swap(0); id != 0 {
						if _, rerr := raw.Revoke(ctx, clientv3.LeaseID(id)); rerr != nil {
							t.Errorf("revoking lease %x: %v", id, rerr)
						}
					}
				}
				return err
			}))
	})
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	acquire := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second, Detached: true}
	plain, err := b.Acquire(ctx, acquire)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	acquire.Key = "e"
	entry, err := b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: acquire, Mode: backend.Exclusive})
	if err != nil {
		t.Fatalf("AcquireMode: %v", err)
	}
	for _, l := range []backend.Lease{plain, entry} {
		revoke.Store(etcdbackend.LeaseOfToken(l.Token))
		if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Renew of %q, its etcd lease revoked after the owner check: got %v, want ErrLeaseLost", l.Key, err)
		}
		if revoke.Load() != 0 {
			t.Errorf("Renew of %q sent no transaction", l.Key)
		}
	}
}
