package sovereign

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// plainBackend hides every optional interface of its backend (Watcher
// among them): an elector on it has no watch, as on Redis with PubSubOff.
type plainBackend struct{ backend.Backend }

// A reclaim (AcquireRequest.Reclaim) is only sound before the old
// deadline: after it, the guard of a later restart may be covering another
// holder's lost lease. An attempt decided while the old deadline had not
// passed, but held back by the bound on calls in flight (enter) until long
// after, must not go out as a reclaim. Here the old leader's attempt waits
// for a place while the first restart's guard ends, another holder takes
// the key and loses it to a second restart; when the place comes, the old
// leader must be refused like everyone else, not lead beside that holder.
func TestReclaimDecidedAfterThePlaceInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = time.Second
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		cl := store.Client()
		defer cl.Close()
		b := &plainBackend{cl}
		e, err := New(b, "election", "old", &Options{TTL: ttl, NoStartupJitter: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		led := make(chan time.Time, 4)
		e.Subscribe(func(ev Event) {
			if _, ok := ev.(LeadershipAcquired); ok {
				select {
				case led <- time.Now():
				default:
				}
			}
		})
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		select {
		case <-led:
		case <-time.After(time.Minute):
			t.Fatal("no leadership within a minute")
		}
		// Between two renewals (every 500 ms): at a renewal instant, the
		// renewal may go before the restart, and the next one comes only
		// half a TTL after it.
		time.Sleep(ttl/2 - 100*time.Millisecond)

		// The first restart loses the lease; every place for calls in
		// flight is taken before the old leader's renewal finds it gone.
		t1 := time.Now()
		store.Restart(&memorybackend.RestartOptions{Guard: ttl})
		limitsMu.Lock()
		l := limits[b]
		limitsMu.Unlock()
		if l == nil {
			t.Fatal("no call limit for the elector's backend")
		}
		taken := 0
		for len(l.slots) < cap(l.slots) {
			l.slots <- struct{}{}
			taken++
		}
		time.Sleep(ttl / 2)
		synctest.Wait()
		if e.IsLeader() {
			t.Fatal("the old leader still leads half a TTL after the restart lost its lease")
		}

		// The first guard ends; another holder takes the key and loses it
		// to a second restart, which refuses free keys for a TTL again.
		time.Sleep(time.Until(t1.Add(ttl + ttl/2)))
		other, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "other", TTL: ttl})
		if err != nil {
			t.Fatalf("another holder after the first guard: %v", err)
		}
		otherUntil := time.Now().Add(ttl)
		time.Sleep(100 * time.Millisecond)
		store.Restart(&memorybackend.RestartOptions{Guard: ttl})
		for range taken {
			<-l.slots
		}

		select {
		case at := <-led:
			if at.Before(otherUntil) {
				t.Fatalf("the old leader led %v after the first restart, %v before the lease of term %d (lost to the second) ended: its attempt, held back for a place in flight, went out as a reclaim long after its old deadline",
					at.Sub(t1), otherUntil.Sub(at), other.Term)
			}
		case <-time.After(time.Minute):
			t.Fatal("no leadership within a minute of the second restart")
		}
	})
}
