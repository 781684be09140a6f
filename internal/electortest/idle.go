package electortest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
)

// selfPrefix begins the frames of this package, which Goroutines skips.
const selfPrefix = "github.com/sovereign-go/sovereign/internal/electortest."

// Goroutines returns the number of goroutines with a frame for which
// match(frame) holds, a frame being the function line of a stack
// ("pkg.Func(...)"). Unlike runtime.NumGoroutine it does not count
// goroutines of earlier tests that are still ending, unless they match;
// frames of this package are skipped, so the caller does not count itself
// by them.
func Goroutines(match func(frame string) bool) int {
	return len(goroutineStacks(match))
}

// goroutineStacks returns the stacks Goroutines counts.
func goroutineStacks(match func(frame string) bool) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var stacks []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, line := range strings.Split(g, "\n") {
			if strings.HasPrefix(line, selfPrefix) {
				continue // the counting goroutine's own frames
			}
			if match(line) {
				stacks = append(stacks, g)
				break
			}
		}
	}
	return stacks
}

// ElectorGoroutines returns the number of goroutines running code of the
// elector (package sovereign).
func ElectorGoroutines() int {
	return Goroutines(isElectorFrame)
}

func isElectorFrame(frame string) bool {
	return strings.HasPrefix(frame, "github.com/sovereign-go/sovereign.")
}

// idleElectorGoroutines bounds the goroutines of idle electors at the
// instant they are counted, however many there are: a few may be resumed
// for a look at the store.
const idleElectorGoroutines = 8

// startElector makes and starts an elector of election name on b; the
// caller closes it.
func startElector(t *testing.T, b backend.Backend, name, id string, ttl time.Duration) *sovereign.Elector {
	t.Helper()
	e, err := sovereign.New(b, name, id, &sovereign.Options{TTL: ttl, NoStartupJitter: true, Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

// IdleElectorsCostNoGoroutine checks that n elections, each with a leader
// and a follower on the two Backends that open returns (a backend.WatchNotifier
// each), come to a moment where their electors run at most a few goroutines
// in all: waiting costs them none. name(i) is election i's name; ttl the
// electors' TTL (on a store that does not report expiries, followers look
// at the key once per TTL).
func IdleElectorsCostNoGoroutine(t *testing.T, n int, open func(t *testing.T) (a, b backend.Backend), name func(i int) string, ttl time.Duration) {
	a, b := open(t)
	var es []*sovereign.Elector
	for i := range n {
		for j, be := range []backend.Backend{a, b} {
			es = append(es, startElector(t, be, name(i), fmt.Sprintf("c%d", j), ttl))
		}
	}
	defer func() {
		for _, e := range es {
			e.Close()
		}
		// A timer's or a context's callback may be waking an elector
		// that just closed: give it a moment to end, as goleak does.
		var left []string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			left = goroutineStacks(isElectorFrame)
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) != 0 {
			t.Errorf("%d elector goroutines 5 s after Close, want 0:\n%s", len(left), strings.Join(left, "\n\n"))
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		leaders, got := 0, ElectorGoroutines()
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
}

// ParkedFollowerTakesOverOnRelease checks that a follower parked on the
// watch of b (or a) takes over as soon as the leader resigns: the release's
// notification wakes it, well before it would look again by itself (after
// at least a TTL; 5 s is the bound).
func ParkedFollowerTakesOverOnRelease(t *testing.T, a, b backend.Backend, name string, ttl time.Duration) {
	es := []*sovereign.Elector{startElector(t, a, name, "c0", ttl), startElector(t, b, name, "c1", ttl)}
	for _, e := range es {
		defer e.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for !(es[0].IsLeader() != es[1].IsLeader() && ElectorGoroutines() == 0) {
		if time.Now().After(deadline) {
			t.Fatalf("no leader with both electors parked after 30s: leading %v %v, %d elector goroutines",
				es[0].IsLeader(), es[1].IsLeader(), ElectorGoroutines())
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
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the parked follower did not take over within 5s of the release (TTL %v)", ttl)
		}
		time.Sleep(5 * time.Millisecond) // polling the state, not synchronising
	}
	t.Logf("took over %v after Resign began", time.Since(start))
}
