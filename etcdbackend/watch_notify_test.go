package etcdbackend_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// TestIdleElectorsCostNoGoroutine: n elections on etcd, each with a leader
// and a follower on two Backends (one shared etcd watch each), come to a
// moment where their electors run no more than a few goroutines in all, for
// n and 2n: waiting costs them none, thanks to the watch's notifications
// (backend.WatchNotifier). Without them each elector keeps one.
func TestIdleElectorsCostNoGoroutine(t *testing.T) {
	for _, n := range []int{50, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			electortest.IdleElectorsCostNoGoroutine(t, n,
				func(t *testing.T) (backend.Backend, backend.Backend) {
					prefix := newPrefix()
					return newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix}),
						newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
				},
				func(i int) string { return fmt.Sprintf("election-%d", i) }, 5*time.Second)
		})
	}
}

// A follower parked on the etcd watch takes over as soon as the leader
// resigns: the release's notification wakes it (it would otherwise look
// again only after ten TTLs).
func TestParkedFollowerTakesOverOnRelease(t *testing.T) {
	prefix := newPrefix()
	electortest.ParkedFollowerTakesOverOnRelease(t,
		newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix}),
		newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix}),
		"election", 5*time.Second)
}
