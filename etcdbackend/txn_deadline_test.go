package etcdbackend_test

import (
	"context"
	"path"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestTxnSendsNoDeadline checks that the transactions of Acquire, Renew and
// Release on a session reach gRPC without a deadline (so no grpc-timeout
// header, and no timer on the server), whether the deadline is the
// caller's or the Backend's request timeout, and that a caller's deadline
// still ends them (TestUnreachableClusterFailsWithinContext checks the
// error on a cluster that never answers).
func TestTxnSendsNoDeadline(t *testing.T) {
	var (
		mu           sync.Mutex
		txns, withDL int
	)
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions,
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if path.Base(method) == "Txn" {
					_, ok := ctx.Deadline()
					mu.Lock()
					txns++
					if ok {
						withDL++
					}
					mu.Unlock()
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}))
	})
	be := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix(), RequestTimeout: time.Minute})
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second}
	for _, name := range []string{"request timeout", "caller's deadline"} {
		ctx := t.Context()
		if name == "caller's deadline" {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
		}
		l, err := be.Acquire(ctx, req)
		if err != nil {
			t.Fatalf("%s: Acquire: %v", name, err)
		}
		if err := be.Renew(ctx, l); err != nil {
			t.Fatalf("%s: Renew: %v", name, err)
		}
		if err := be.Release(ctx, l); err != nil {
			t.Fatalf("%s: Release: %v", name, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if txns < 6 || withDL != 0 {
		t.Fatalf("%d transactions, %d of them with a deadline; want at least 6, none with a deadline", txns, withDL)
	}
}
