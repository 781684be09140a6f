package redisbackend_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// wakeCounter is a Redis backend whose muted renewal watches count the
// times they wake their receiver (notify).
type wakeCounter struct {
	*redisbackend.Backend
	wakes atomic.Int64
}

func (w *wakeCounter) WatchRenewalsMuted(ctx context.Context, key string, notify func(), muted *backend.Mute) (<-chan backend.Event, error) {
	return w.Backend.WatchRenewalsMuted(ctx, key, func() { w.wakes.Add(1); notify() }, muted)
}

// TestLeaderMutesItsRenewals: a leader's own renewals come back to its
// watch connection (it watches its key for releases and changes), and
// each woke it: 10,000 elections led by one process cost it more than 3 %
// of a core. A leader now mutes them (backend.RenewalMuter): over 10 of its
// renewals it is woken at most once. Once it has stepped down, its watch
// tells of the next leader's renewals again: it is woken by them and makes
// no acquisition attempt while they come.
func TestLeaderMutesItsRenewals(t *testing.T) {
	srv := testredis.Start(t)
	newElector := func(id string, h *acquireCounter, renew time.Duration) (*sovereign.Elector, *wakeCounter) {
		rdb := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
		rdb.AddHook(h)
		b, err := redisbackend.New(rdb, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		wb := &wakeCounter{Backend: b}
		e, err := sovereign.New(wb, "daemon", id, &sovereign.Options{TTL: electorTTL, RenewInterval: renew, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		return e, wb
	}
	const renew = 100 * time.Millisecond
	ha, hb := &acquireCounter{}, &acquireCounter{}
	rec := &electortest.Recorder{}
	a, wa := newElector("a", ha, renew)
	rec.Campaign(t, a)
	electortest.Eventually(t, "a leads", a.IsLeader)
	before := wa.wakes.Load()
	time.Sleep(10 * renew) // the window observed, not synchronisation
	if n := wa.wakes.Load() - before; n > 1 {
		t.Errorf("the leader was woken %d times by its watch over 10 of its renewals, want at most 1", n)
	}

	b, _ := newElector("b", hb, renew)
	rec.Campaign(t, b)
	electortest.Eventually(t, "b's first attempt", func() bool { return hb.n.Load() > 0 })
	if err := a.Resign(ctxBound(t)); err != nil {
		t.Fatal(err)
	}
	electortest.Eventually(t, "b leads", b.IsLeader)
	beforeWakes, beforeAttempts := wa.wakes.Load(), ha.n.Load()
	time.Sleep(3 * electorTTL) // the window observed, not synchronisation
	if n := wa.wakes.Load() - beforeWakes; n < 10 {
		t.Errorf("a, a follower again, was woken %d times in 3 TTLs while b renewed every %v, want its renewals (about 30)", n, renew)
	}
	if n := ha.n.Load() - beforeAttempts; n != 0 {
		t.Errorf("a, a follower again, made %d acquisition attempts in 3 TTLs while b renewed, want 0", n)
	}
	electortest.CheckNoOverlap(t, rec.Intervals())
}
