package lock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// detachedSpy records the Detached flag of every plain acquisition.
type detachedSpy struct {
	*memorybackend.Backend
	mu       sync.Mutex
	detached []bool
}

func (s *detachedSpy) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	s.mu.Lock()
	s.detached = append(s.detached, req.Detached)
	s.mu.Unlock()
	return s.Backend.Acquire(ctx, req)
}

// TestDetached: a lock that stops renewing on its own (NoRenew, MaxHold)
// asks the backend for a lease of its own (AcquireRequest.Detached), so a
// backend that keeps an instance's leases alive together (etcd's session)
// cannot keep it alive past its TTL; a renewed lock does not.
func TestDetached(t *testing.T) {
	store := memorybackend.NewStore()
	s := &detachedSpy{Backend: client(t, store)}
	l := newLocker(t, s, "alice", fastOpts())
	cases := []struct {
		name string
		ao   *lock.AcquireOptions
		want bool
	}{
		{"renewed", nil, false},
		{"NoRenew", &lock.AcquireOptions{NoRenew: true}, true},
		{"MaxHold", &lock.AcquireOptions{MaxHold: time.Minute}, true},
	}
	for i, c := range cases {
		lk, err := l.TryAcquire(t.Context(), c.name, c.ao)
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", c.name, err)
		}
		if err := lk.Release(t.Context()); err != nil {
			t.Fatalf("%s: Release: %v", c.name, err)
		}
		s.mu.Lock()
		got := s.detached
		s.mu.Unlock()
		if len(got) != i+1 {
			t.Fatalf("%s: %d Acquire calls in all, want %d", c.name, len(got), i+1)
		}
		if got[i] != c.want {
			t.Errorf("%s: AcquireRequest.Detached = %v, want %v", c.name, got[i], c.want)
		}
	}
}
