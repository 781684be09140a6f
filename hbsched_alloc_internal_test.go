package sovereign

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// A heartbeat batch of many elections allocates a few objects, none per
// election: the scheduler keeps its buffers from one batch to the next and
// each member's request ready, and noting the backend's answer takes no
// allocation. Every member's heartbeat is still sent, as asked, and its
// answer noted.
func TestHeartbeatBatchAllocations(t *testing.T) {
	const n = 1000
	ttl := 7 * time.Second
	answers := make([]error, n)
	sent := map[string]int{}
	s := &hbScheduler{key: hbKey{interval: time.Hour, timeout: time.Second}, members: map[*Elector]*hbMember{}}
	s.send = func(_ context.Context, reqs []backend.HeartbeatRequest) []error {
		for _, r := range reqs {
			if r.ID != "me" || r.TTL != ttl {
				t.Errorf("request %+v, want ID me and TTL %v", r, ttl)
			}
			sent[r.Key]++ // no allocation once every key is in
		}
		return answers[:len(reqs)]
	}
	for i := range n {
		e := &Elector{name: fmt.Sprintf("e%d", i), id: "me", okBase: time.Now()}
		e.okAt.Store(noAnswer)
		s.members[e] = &hbMember{e: e, req: backend.HeartbeatRequest{Key: e.name, ID: e.id, TTL: ttl}}
	}
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.timer != nil {
			s.timer.Stop()
		}
	}()
	allDue := func() {
		for _, m := range s.members {
			m.next = time.Time{}
		}
	}
	allDue()
	s.fire() // fills the map of keys sent and the scheduler's buffers
	runs := 0
	allocs := testing.AllocsPerRun(10, func() {
		allDue()
		s.fire()
		runs++
	})
	if allocs > 10 {
		t.Errorf("a heartbeat batch of %d elections: %.0f allocations, want a few, none per election", n, allocs)
	}
	for e, m := range s.members {
		if got := sent[e.name]; got != runs+1 {
			t.Fatalf("%s: %d heartbeats sent, want %d", e.name, got, runs+1)
		}
		if e.lastOK().IsZero() {
			t.Fatalf("%s: the backend's answer was not noted", e.name)
		}
		if !m.next.After(time.Now()) {
			t.Fatalf("%s: next heartbeat at %v, want after the batch", e.name, m.next)
		}
	}
	t.Logf("%.0f allocations per batch of %d", allocs, n)
}
