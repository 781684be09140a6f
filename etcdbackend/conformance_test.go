package etcdbackend_test

import (
	"context"
	"maps"
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
		var (
			mu     sync.Mutex
			opened []*etcdbackend.Backend
		)
		return backendtest.Env{
			Open: func() backend.Backend {
				b, err := etcdbackend.New(newClient(t, ec, grants.configure), &etcdbackend.Options{Prefix: prefix})
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				mu.Lock()
				opened = append(opened, b)
				mu.Unlock()
				return b
			},
			// Whole seconds; 2s so that a lease read just after a renewal
			// still shows a remaining TTL of at least one second.
			ShortTTL: 2 * time.Second,
			// The keys under the prefix (records, entries, heartbeats;
			// not lease marks) and the live leases granted to this Env's
			// clients (unused grants and heartbeat leases included),
			// except the leases each Backend shares between keys (a
			// session per TTL, heartbeat sessions): their number does not grow with
			// the keys used, and each ends at its TTL once unused (their
			// keys are counted).
			Size: func() int {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				keys, err := raw.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil {
					t.Fatalf("Size: count keys: %v", err)
				}
				// Lease marks are one per lease, not per key, and end
				// with their lease: a shared lease's is left out with
				// it, any other's counted with its lease.
				marks, err := raw.Get(ctx, prefix+"\x00lease/", clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil {
					t.Fatalf("Size: count lease marks: %v", err)
				}
				leases, err := raw.Leases(ctx)
				if err != nil {
					t.Fatalf("Size: list leases: %v", err)
				}
				shared := make(map[int64]bool)
				mu.Lock()
				for _, b := range opened {
					maps.Copy(shared, etcdbackend.SharedLeases(b))
				}
				mu.Unlock()
				live := leases.Leases[:0:0]
				for _, l := range leases.Leases {
					if !shared[int64(l.ID)] {
						live = append(live, l)
					}
				}
				return int(keys.Count-marks.Count) + grants.live(live)
			},
			// Terms are revisions, and no release writes a marker, so
			// nothing of a key outlives its lease; the 5 s are slack
			// for a loaded machine.
			Retention: 5 * time.Second,
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
