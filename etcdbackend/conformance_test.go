package etcdbackend_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// TestConformance runs the suite on a server of its own (its restart
// subtests stop it), each subtest under its own prefix.
func TestConformance(t *testing.T) {
	ec := testetcd.Start(t)
	raw := newClient(t, ec, nil)
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		prefix := newPrefix()
		var grants leaseSet // every lease this Env's clients were granted
		return backendtest.Env{
			Open: func() backend.Backend {
				b, err := etcdbackend.New(newClient(t, ec, grants.configure), &etcdbackend.Options{Prefix: prefix})
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return b
			},
			// Whole seconds; 2s so that a lease read just after a renewal
			// still shows a remaining TTL of at least one second.
			ShortTTL: 2 * time.Second,
			// The keys under the prefix (records, heartbeats, release
			// markers) and the live leases granted to this Env's clients
			// (unused grants and heartbeat leases included).
			Size: func() int {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				keys, err := raw.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil {
					t.Fatalf("Size: count keys: %v", err)
				}
				leases, err := raw.Leases(ctx)
				if err != nil {
					t.Fatalf("Size: list leases: %v", err)
				}
				return int(keys.Count) + grants.live(leases.Leases)
			},
			// Nothing outlives a lease: terms are revisions.
			Retention: 0,
			Restart: func(loseData bool) {
				var err error
				if loseData {
					err = ec.RestartWithoutData(0)
				} else {
					ec.Stop(0)
					err = ec.Restart(0)
				}
				if err != nil {
					t.Fatalf("restart: %v", err)
				}
			},
			// Revisions start again from 1 on an empty data directory.
			TermsSurviveDataLoss: false,
		}
	})
}

// leaseSet records the etcd leases granted to the clients it configures.
type leaseSet struct {
	mu  sync.Mutex // guards ids
	ids map[int64]struct{}
}

// configure adds to cfg an interceptor that records granted leases.
func (s *leaseSet) configure(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if g, ok := reply.(*etcdserverpb.LeaseGrantResponse); ok && err == nil && g.ID != 0 {
				s.mu.Lock()
				if s.ids == nil {
					s.ids = make(map[int64]struct{})
				}
				s.ids[g.ID] = struct{}{}
				s.mu.Unlock()
			}
			return err
		}))
}

// live returns how many of the leases, the live ones of a server, are in s.
func (s *leaseSet) live(leases []clientv3.LeaseStatus) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range leases {
		if _, ok := s.ids[int64(l.ID)]; ok {
			n++
		}
	}
	return n
}
