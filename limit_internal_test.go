package sovereign

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/memorybackend"
)

// The electors of one backend share one bound while any of them runs; the
// last one to stop drops it, so a backend no longer used is not kept.
func TestLimitDroppedWithItsLastElector(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		users := func() int {
			limitsMu.Lock()
			defer limitsMu.Unlock()
			if l := limits[c]; l != nil {
				return l.users
			}
			return 0
		}
		var es []*Elector
		for _, name := range []string{"x", "y"} {
			e, err := New(c, name, "a", &Options{TTL: time.Second, NoStartupJitter: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		synctest.Wait()
		if n := users(); n != 2 {
			t.Fatalf("users of the backend's bound with two electors running: got %d, want 2", n)
		}
		es[0].Close()
		if n := users(); n != 1 {
			t.Errorf("users after one elector stopped: got %d, want 1", n)
		}
		es[1].Close()
		limitsMu.Lock()
		_, kept := limits[c]
		limitsMu.Unlock()
		if kept {
			t.Error("the backend's bound is kept after its last elector stopped")
		}
	})
}
