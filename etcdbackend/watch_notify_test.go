package etcdbackend_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// electorGoroutines returns the number of goroutines running code of the
// elector (package sovereign), by their stacks.
func electorGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "\ngithub.com/sovereign-go/sovereign.") {
			count++
		}
	}
	return count
}

// idleElectorGoroutines bounds the goroutines of idle electors at the
// instant they are counted, however many there are: a few may be resumed
// for a look at the store.
const idleElectorGoroutines = 8

// TestIdleElectorsCostNoGoroutine: n elections on etcd, each with a leader
// and a follower on two Backends (one shared etcd watch each), come to a
// moment where their electors run no more than a few goroutines in all, for
// n and 2n: waiting costs them none, thanks to the watch's notifications
// (backend.WatchNotifier). Without them each elector keeps one.
func TestIdleElectorsCostNoGoroutine(t *testing.T) {
	for _, n := range []int{50, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			prefix := newPrefix()
			a := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
			b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
			var es []*sovereign.Elector
			for i := range n {
				for j, be := range []backend.Backend{a, b} {
					e, err := sovereign.New(be, fmt.Sprintf("election-%d", i), fmt.Sprintf("c%d", j),
						&sovereign.Options{TTL: 5 * time.Second, NoStartupJitter: true, Logger: electortest.Logger()})
					if err != nil {
						t.Fatal(err)
					}
					if err := e.Start(context.Background()); err != nil {
						t.Fatal(err)
					}
					es = append(es, e)
				}
			}
			defer func() {
				for _, e := range es {
					e.Close()
				}
				if got := electorGoroutines(); got != 0 {
					t.Errorf("%d elector goroutines after Close, want 0", got)
				}
			}()
			deadline := time.Now().Add(time.Minute)
			for {
				leaders, got := 0, electorGoroutines()
				for _, e := range es {
					if e.IsLeader() {
						leaders++
					}
				}
				if leaders == n && got <= idleElectorGoroutines {
					t.Logf("%d elections (%d electors) lead and follow with %d elector goroutines", n, len(es), got)
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d electors of %d elections: %d lead, %d elector goroutines after a minute; want %d leaders, at most %d goroutines",
						len(es), n, leaders, got, n, idleElectorGoroutines)
				}
				time.Sleep(50 * time.Millisecond) // polling the state, not synchronising
			}
		})
	}
}

// A follower parked on the etcd watch takes over as soon as the leader
// resigns: the release's notification wakes it (it would otherwise look
// again only after ten TTLs).
func TestParkedFollowerTakesOverOnRelease(t *testing.T) {
	prefix := newPrefix()
	a := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	var es []*sovereign.Elector
	for j, be := range []backend.Backend{a, b} {
		e, err := sovereign.New(be, "election", fmt.Sprintf("c%d", j),
			&sovereign.Options{TTL: 5 * time.Second, NoStartupJitter: true, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		es = append(es, e)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !(es[0].IsLeader() != es[1].IsLeader() && electorGoroutines() == 0) {
		if time.Now().After(deadline) {
			t.Fatalf("no leader with both electors parked after 30s: leading %v %v, %d elector goroutines",
				es[0].IsLeader(), es[1].IsLeader(), electorGoroutines())
		}
		time.Sleep(20 * time.Millisecond) // polling the state, not synchronising
	}
	leader, follower := es[0], es[1]
	if !leader.IsLeader() {
		leader, follower = follower, leader
	}
	start := time.Now()
	if err := leader.Resign(context.Background()); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	for !follower.IsLeader() {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the parked follower did not take over within 10s of the release (it looks again only after 50s)")
		}
		time.Sleep(5 * time.Millisecond) // polling the state, not synchronising
	}
	t.Logf("took over %v after Resign began", time.Since(start))
}
