package redisbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// electorTTL is the lease TTL of the elector tests: RenewDeadline 700ms,
// RenewInterval 200ms by the elector's default ratios.
const electorTTL = time.Second

// term is one leadership term as seen by the leader function.
type term struct {
	id         string
	term       uint64
	start, end time.Time // leader function entered; leader context seen cancelled
}

// cluster is a set of candidates campaigning over one real Redis server,
// each with its own client and ACL user so that one can be cut off.
type cluster struct {
	t     testing.TB
	srv   *testredis.Server
	admin *redis.Client
	name  string
	cands []*candidate

	mu     sync.Mutex // guards terms and starts
	terms  []term     // finished terms
	starts []term     // every term begun (end unset)
}

type candidate struct {
	id     string
	e      *sovereign.Elector
	cancel context.CancelFunc
	done   chan struct{}
}

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
		Logger:          testLogger(),
	})
	if err != nil {
		t.Fatalf("sovereign.New: %v", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	cand := &candidate{id: id, e: e, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(cand.done)
		_ = e.Run(runCtx, func(leaderCtx context.Context) error {
			n, ok := sovereign.TermFromContext(leaderCtx)
			if !ok {
				t.Errorf("%s: leader context carries no term", id)
			}
			tm := term{id: id, term: n, start: time.Now()}
			c.mu.Lock()
			c.starts = append(c.starts, tm)
			c.mu.Unlock()
			<-leaderCtx.Done()
			tm.end = time.Now()
			c.mu.Lock()
			c.terms = append(c.terms, tm)
			c.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-cand.done
	})
	c.cands = append(c.cands, cand)
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
	var got *candidate
	eventually(c.t, "one leader", func() bool {
		got = nil
		for _, cand := range c.cands {
			if cand.e.IsLeader() {
				if got != nil {
					c.t.Fatalf("%s and %s lead at once", got.id, cand.id)
				}
				got = cand
			}
		}
		return got != nil && got != except
	})
	return got
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

// ended returns the finished term of id with the given term number.
func (c *cluster) ended(id string, n uint64) term {
	c.t.Helper()
	var got term
	eventually(c.t, fmt.Sprintf("end of term %d of %s", n, id), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, tm := range c.terms {
			if tm.id == id && tm.term == n {
				got = tm
				return true
			}
		}
		return false
	})
	return got
}

// startOf returns when the leader function of cand's current term began.
func (c *cluster) startOf(cand *candidate) time.Time {
	c.t.Helper()
	n := cand.e.Term()
	var got time.Time
	eventually(c.t, fmt.Sprintf("start of term %d of %s", n, cand.id), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, tm := range c.starts {
			if tm.id == cand.id && tm.term == n {
				got = tm.start
				return true
			}
		}
		return false
	})
	return got
}

// checkNoOverlap fails if two recorded terms overlap in time or terms do
// not increase with time.
func (c *cluster) checkNoOverlap() {
	c.t.Helper()
	c.mu.Lock()
	terms := slices.Clone(c.terms)
	c.mu.Unlock()
	slices.SortFunc(terms, func(a, b term) int { return a.start.Compare(b.start) })
	for i := 1; i < len(terms); i++ {
		prev, cur := terms[i-1], terms[i]
		if cur.start.Before(prev.end) {
			c.t.Errorf("term %d of %s started at %v, before term %d of %s ended at %v",
				cur.term, cur.id, cur.start.Format("15:04:05.000"), prev.term, prev.id, prev.end.Format("15:04:05.000"))
		}
		if cur.term <= prev.term {
			c.t.Errorf("term %d of %s followed term %d of %s: got no increase", cur.term, cur.id, prev.term, prev.id)
		}
	}
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
	for _, cand := range c.cands {
		cand.cancel()
		<-cand.done
	}
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
	ended := c.ended(old.id, oldTerm)
	renewDeadline := old.e.Options().RenewDeadline
	if d := ended.end.Sub(cut); d > renewDeadline+200*time.Millisecond {
		t.Errorf("cut-off leader stepped down %v after the cut, want within its renew deadline %v", d, renewDeadline)
	}
	if newTerm <= oldTerm {
		t.Errorf("term after failover: got %d, want > %d", newTerm, oldTerm)
	}
	c.reconnect(old.id)
	for _, cand := range c.cands {
		cand.cancel()
		<-cand.done
	}
	c.checkNoOverlap()
	t.Logf("failover after cut-off: %v (TTL %v); old leader stepped down %v after the cut",
		took, electorTTL, ended.end.Sub(cut))
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
	ended := c.ended(old.id, oldTerm)
	renewDeadline := old.e.Options().RenewDeadline
	if d := ended.end.Sub(down); d > renewDeadline+200*time.Millisecond {
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
	for _, cand := range c.cands {
		cand.cancel()
		<-cand.done
	}
	c.checkNoOverlap()
	t.Logf("leader stepped down %v after the kill; new leader (term %d) %v after the restart",
		ended.end.Sub(down), newTerm, recovered)
}

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.Default()
	}
	return slog.New(slog.DiscardHandler)
}
