package keeper_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// A hold has no goroutine of its own: holding 100 leases through ten
// renewals each, and releasing them, leaves the number of goroutines where it
// was, and Finished is closed as soon as a successful Release returns.
func TestHoldsStartNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		cfg := config(c)
		cfg.MaxHold = time.Hour
		base := bubbleGoroutines()
		holds := make([]*keeper.Hold, 100)
		for i := range holds {
			sent := time.Now()
			l, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: fmt.Sprintf("k%d", i), HolderID: "a", TTL: cfg.TTL})
			if err != nil {
				t.Fatal(err)
			}
			holds[i] = keeper.Start(t.Context(), cfg, l, sent)
		}
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines after starting 100 holds: %d, want %d (none per hold)", n, base)
		}
		time.Sleep(2 * time.Second) // ten renewals each
		synctest.Wait()
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines while holding 100 leases: %d, want %d (none per hold)", n, base)
		}
		if got := c.Calls()["Renew"]; got != 1000 {
			t.Errorf("renewals in 2s: got %d, want 1000 (100 holds every 200ms)", got)
		}
		for i, h := range holds {
			if !h.Held() {
				t.Fatalf("hold %d not held", i)
			}
			if err := h.Release(context.Background()); err != nil {
				t.Fatalf("Release: %v", err)
			}
			select {
			case <-h.Finished():
			default:
				t.Fatal("Finished not closed when a successful Release returned")
			}
		}
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines after releasing: %d, want %d", n, base)
		}
	})
}

// renewProbe counts Renew calls in flight and notes renewals sent after a
// Release returned.
type renewProbe struct {
	backend.Backend
	mu          sync.Mutex
	inFlight    int
	maxInFlight int
	released    bool
	lateRenews  int
}

func (p *renewProbe) Renew(ctx context.Context, l backend.Lease) error {
	p.mu.Lock()
	p.inFlight++
	p.maxInFlight = max(p.maxInFlight, p.inFlight)
	if p.released {
		p.lateRenews++
	}
	p.mu.Unlock()
	err := p.Backend.Renew(ctx, l)
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
	return err
}

// RenewNow during a renewal asks for one more after it, never a second one
// at the same time; Release waits for the renewal in flight, so none is sent
// after it.
func TestRenewNowNeverOverlaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		p := &renewProbe{Backend: c}
		cfg := config(p)
		h := start(t, c, cfg)
		c.SetLatency(50 * time.Millisecond)
		h.RenewNow()
		h.RenewNow()
		time.Sleep(10 * time.Millisecond)
		h.RenewNow()
		h.RenewNow()
		time.Sleep(140 * time.Millisecond)
		// Two renewals (the first, then one for the RenewNow calls made
		// while it ran), ended at 100ms; the periodic one is due at 300ms.
		if got := c.Calls()["Renew"]; got != 2 {
			t.Errorf("renewals after RenewNow x4: got %d, want 2", got)
		}
		time.Sleep(200 * time.Millisecond) // the periodic renewal is in flight
		h.RenewNow()
		if err := h.Release(context.Background()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		p.mu.Lock()
		p.released = true
		p.mu.Unlock()
		<-h.Finished()
		time.Sleep(2 * time.Second)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.maxInFlight != 1 {
			t.Errorf("renewals in flight at once: up to %d, want 1", p.maxInFlight)
		}
		if p.lateRenews != 0 {
			t.Errorf("%d renewals sent after Release returned", p.lateRenews)
		}
		if _, err := c.Get(t.Context(), "k"); err == nil {
			t.Error("lease still held after Release")
		}
	})
}

// bubbleGoroutines counts the goroutines of the running synctest bubble (of
// every bubble, but tests in this package do not run in parallel), so that
// goroutines other tests left winding down outside it do not count.
func bubbleGoroutines() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte(", synctest bubble "))
		}
		buf = make([]byte, 2*len(buf))
	}
}
