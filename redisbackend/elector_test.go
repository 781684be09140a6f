package redisbackend_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// electorTTL is the lease TTL of the elector tests: RenewDeadline 700ms,
// RenewInterval 200ms by the elector's default ratios.
const electorTTL = time.Second

// cluster is a set of candidates campaigning over one real Redis server,
// each with its own client and ACL user so that one can be cut off.
type cluster struct {
	t     testing.TB
	srv   *testredis.Server
	admin *redis.Client
	name  string
	cands []*candidate
	rec   electortest.Recorder
}

type candidate struct {
	id   string
	e    *sovereign.Elector
	stop func() // ends Run and waits for it
}

// Elector returns the candidate's elector.
func (cand *candidate) Elector() *sovereign.Elector { return cand.e }

func newCluster(t testing.TB, srv *testredis.Server, n int) *cluster {
	t.Helper()
	c := &cluster{t: t, srv: srv, admin: srv.NewClient(t, nil), name: fmt.Sprintf("election-%d", time.Now().UnixNano())}
	for i := range n {
		c.add(fmt.Sprintf("cand-%d", i))
	}
	return c
}

func (c *cluster) add(id string) {
	t := c.t
	t.Helper()
	c.setUser(id)
	client := c.srv.NewClient(t, &redis.Options{Username: id, Password: "pw-" + id, ContextTimeoutEnabled: true,
		MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	b := newBackend(t, client, nil)
	e, err := sovereign.New(b, c.name, id, &sovereign.Options{
		TTL:             electorTTL,
		NoStartupJitter: true,
		Logger:          electortest.Logger(),
	})
	if err != nil {
		t.Fatalf("sovereign.New: %v", err)
	}
	c.cands = append(c.cands, &candidate{id: id, e: e, stop: c.rec.Campaign(t, e)})
}

// setUser creates (or recreates, after a restart) the ACL user of id.
func (c *cluster) setUser(id string) {
	c.t.Helper()
	if err := c.admin.Do(context.Background(), "ACL", "SETUSER", id, "on", ">pw-"+id, "~*", "&*", "+@all").Err(); err != nil {
		c.t.Fatalf("ACL SETUSER %s: %v", id, err)
	}
}

// leader waits until exactly one candidate other than except leads, and
// returns it.
func (c *cluster) leader(except *candidate) *candidate {
	c.t.Helper()
	return electortest.WaitLeader(c.t, except, c.cands)
}

// cutOff makes id unable to talk to Redis: its ACL user is disabled and all
// its connections are killed, as if its host lost the network.
func (c *cluster) cutOff(id string) {
	c.t.Helper()
	ctx := context.Background()
	if err := c.admin.Do(ctx, "ACL", "SETUSER", id, "off").Err(); err != nil {
		c.t.Fatalf("ACL SETUSER %s off: %v", id, err)
	}
	if err := c.admin.Do(ctx, "CLIENT", "KILL", "USER", id).Err(); err != nil {
		c.t.Fatalf("CLIENT KILL USER %s: %v", id, err)
	}
}

func (c *cluster) reconnect(id string) {
	c.t.Helper()
	if err := c.admin.Do(context.Background(), "ACL", "SETUSER", id, "on").Err(); err != nil {
		c.t.Fatalf("ACL SETUSER %s on: %v", id, err)
	}
}

// startOf returns when the leader function of cand's current term began.
func (c *cluster) startOf(cand *candidate) time.Time {
	c.t.Helper()
	return c.rec.Started(c.t, cand.id, cand.e.Term()).Start
}

// stopAll stops every candidate.
func (c *cluster) stopAll() {
	for _, cand := range c.cands {
		cand.stop()
	}
}

// checkNoOverlap fails if two recorded terms overlap in time or terms do
// not increase with time. Call it after stopAll, so every term has ended.
func (c *cluster) checkNoOverlap() {
	c.t.Helper()
	electortest.CheckNoOverlap(c.t, c.rec.Intervals())
}

// TestElectorGracefulHandover: three candidates over real Redis; the leader
// resigns and another takes over within milliseconds (pub/sub), with a
// higher term and no overlap.
func TestElectorGracefulHandover(t *testing.T) {
	srv := testredis.Start(t)
	c := newCluster(t, srv, 3)
	for range 3 {
		old := c.leader(nil)
		oldTerm := old.e.Term()
		start := time.Now()
		if err := old.e.Resign(ctxBound(t)); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		next := c.leader(old)
		took := time.Since(start)
		if took > electorTTL/2 {
			t.Errorf("hand-over took %v, want well below the TTL %v (a release wakes the followers)", took, electorTTL)
		}
		if next.e.Term() <= oldTerm {
			t.Errorf("term after hand-over: got %d, want > %d", next.e.Term(), oldTerm)
		}
	}
	c.stopAll()
	c.checkNoOverlap()
}

// TestElectorLeaderCutOff: the leader's connections are killed and it
// cannot reconnect; it steps down by its renew deadline, and another
// candidate leads within TTL plus a margin, after it, with a higher term.
func TestElectorLeaderCutOff(t *testing.T) {
	srv := testredis.Start(t)
	c := newCluster(t, srv, 3)
	old := c.leader(nil)
	oldTerm := old.e.Term()
	cut := time.Now()
	c.cutOff(old.id)
	next := c.leader(old)
	took := time.Since(cut)
	newTerm := next.e.Term()
	const margin = 500 * time.Millisecond
	if took > electorTTL+margin {
		t.Errorf("failover took %v, want within TTL %v + %v", took, electorTTL, margin)
	}
	ended := c.rec.Ended(t, old.id, oldTerm)
	renewDeadline := old.e.Options().RenewDeadline
	if d := ended.End.Sub(cut); d > renewDeadline+200*time.Millisecond {
		t.Errorf("cut-off leader stepped down %v after the cut, want within its renew deadline %v", d, renewDeadline)
	}
	if newTerm <= oldTerm {
		t.Errorf("term after failover: got %d, want > %d", newTerm, oldTerm)
	}
	c.reconnect(old.id)
	c.stopAll()
	c.checkNoOverlap()
	t.Logf("failover after cut-off: %v (TTL %v); old leader stepped down %v after the cut",
		took, electorTTL, ended.End.Sub(cut))
}

// TestElectorServerRestart: redis-server is killed while a leader holds the
// lease; the leader steps down by its renew deadline since it cannot renew,
// and after the restart (with an append-only file, so the term counter
// survives) the election recovers with a higher term.
func TestElectorServerRestart(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Persistent: true})
	c := newCluster(t, srv, 3)
	old := c.leader(nil)
	oldTerm := old.e.Term()
	down := time.Now()
	srv.Kill(t)
	ended := c.rec.Ended(t, old.id, oldTerm)
	renewDeadline := old.e.Options().RenewDeadline
	if d := ended.End.Sub(down); d > renewDeadline+200*time.Millisecond {
		t.Errorf("leader stepped down %v after the server died, want within its renew deadline %v", d, renewDeadline)
	}
	for _, cand := range c.cands {
		if cand.e.IsLeader() {
			t.Errorf("%s leads while the server is down", cand.id)
		}
	}
	srv.Start(t)
	up := time.Now()
	for _, cand := range c.cands { // ACL users are not persisted
		c.setUser(cand.id)
	}
	next := c.leader(nil)
	recovered := time.Since(up)
	newTerm := next.e.Term()
	if newTerm <= oldTerm {
		t.Errorf("term after restart: got %d, want > %d (the counter survives in the AOF)", newTerm, oldTerm)
	}
	c.stopAll()
	c.checkNoOverlap()
	t.Logf("leader stepped down %v after the kill; new leader (term %d) %v after the restart",
		ended.End.Sub(down), newTerm, recovered)
}
