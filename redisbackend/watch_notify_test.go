package redisbackend_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// TestIdleElectorsCostNoGoroutine: n elections on one Redis server, each
// with a leader and a follower on two Backends (one pub/sub connection
// each), come to a moment where their electors run no more than a few
// goroutines in all, for n and 2n: waiting costs them none, thanks to the
// watch's notifications (backend.WatchNotifier). Without them each elector
// keeps one. A long TTL: followers (Redis does not report expiries) look at
// the key once per TTL.
func TestIdleElectorsCostNoGoroutine(t *testing.T) {
	srv := testredis.Start(t)
	for _, n := range []int{50, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			prefix := fmt.Sprintf("idle-%d-%d", n, time.Now().UnixNano())
			electortest.IdleElectorsCostNoGoroutine(t, n,
				func(t *testing.T) (backend.Backend, backend.Backend) {
					return newBackend(t, srv.NewClient(t, nil), nil), newBackend(t, srv.NewClient(t, nil), nil)
				},
				func(i int) string { return fmt.Sprintf("%s-%d", prefix, i) }, 10*time.Second)
		})
	}
}

// A follower parked on a Redis watch takes over as soon as the leader
// resigns: the release's notification wakes it (it would otherwise look
// again only after a TTL, 10 s here).
func TestParkedFollowerTakesOverOnRelease(t *testing.T) {
	srv := testredis.Start(t)
	electortest.ParkedFollowerTakesOverOnRelease(t,
		newBackend(t, srv.NewClient(t, nil), nil), newBackend(t, srv.NewClient(t, nil), nil),
		fmt.Sprintf("parked-%d", time.Now().UnixNano()), 10*time.Second)
}
