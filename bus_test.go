package sovereign_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// blockedListener is a listener that blocks until its gate opens and records what it
// received.
type blockedListener struct {
	gate chan struct{}
	mu   sync.Mutex
	got  []sovereign.Event
}

func newBlockedListener(e *sovereign.Elector) *blockedListener {
	g := &blockedListener{gate: make(chan struct{})}
	e.Subscribe(func(ev sovereign.Event) {
		<-g.gate
		g.mu.Lock()
		g.got = append(g.got, ev)
		g.mu.Unlock()
	})
	return g
}

func (g *blockedListener) events() []sovereign.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]sovereign.Event(nil), g.got...)
}

// droppedMetrics counts the events Metrics.EventsDropped reports.
type droppedMetrics struct {
	sovereign.NopMetrics
	n atomic.Int64
}

func (m *droppedMetrics) EventsDropped(_ string, count int) { m.n.Add(int64(count)) }

// A listener that falls more than 1024 events behind loses the oldest: the
// events that came last (here the leadership taken once the store is back,
// after ten minutes of failures) are still delivered, after an EventsDropped,
// and Metrics.EventsDropped counts the events lost.
func TestSlowListenerLosesTheOldest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		mem.Partition() // every attempt fails: a stream of ElectionFailed
		o := fastOpts()
		m := &droppedMetrics{}
		o.Metrics = m
		e, err := sovereign.New(mem, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		g := newBlockedListener(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Minute) // more than 1024 failures
		mem.Heal()
		waitLeader(t, e, 5*time.Second)
		close(g.gate)
		synctest.Wait()
		got := g.events()
		dropped, acquired, count := -1, -1, 0
		for i, ev := range got {
			switch ev := ev.(type) {
			case sovereign.EventsDropped:
				dropped = i
				count += ev.Count
			case sovereign.LeadershipAcquired:
				acquired = i
			}
		}
		if dropped < 0 || acquired < dropped {
			t.Errorf("EventsDropped at %d, LeadershipAcquired at %d of %d events: want both, the acquisition after the drop", dropped, acquired, len(got))
		}
		if n := m.n.Load(); n != int64(count) {
			t.Errorf("Metrics.EventsDropped counted %d events, want %d (the EventsDropped counts delivered)", n, count)
		}
	})
}

// Close delivers every queued event before it returns, its own step-down
// included, then closes the channels of Observe; Observe after Close
// returns a channel that holds the last leader known and is closed.
func TestCloseDeliversEveryQueuedEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		g := newBlockedListener(e)
		obs := e.Observe(context.Background())
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, e, time.Second)
		closed := make(chan struct{})
		go func() {
			e.Close()
			close(closed)
		}()
		synctest.Wait() // Close waits for the listener
		select {
		case <-closed:
			t.Fatal("Close returned while a listener still had events queued")
		default:
		}
		close(g.gate)
		<-closed
		got := g.events()
		if len(got) < 2 {
			t.Fatalf("listener received %d events, want the term's and the step-down's", len(got))
		}
		// The step-down publishes StateChanged and LeadershipLost, the
		// release LeaderChanged with no leader.
		n := len(got)
		if l, ok := got[n-2].(sovereign.LeadershipLost); !ok || l.Reason != sovereign.ReasonClosed {
			t.Errorf("second-to-last event: got %#v, want LeadershipLost (closed)", got[n-2])
		}
		if lc, ok := got[n-1].(sovereign.LeaderChanged); !ok || lc.HasLeader() {
			t.Errorf("last event: got %#v, want LeaderChanged with no leader", got[n-1])
		}
		for range obs { // drains, and ends only when the channel is closed
		}
		after := e.Observe(context.Background())
		select {
		case <-after:
		case <-time.After(time.Second):
			t.Fatal("Observe after Close: no value")
		}
		select {
		case r, ok := <-after:
			if ok {
				t.Errorf("Observe after Close: got a second value %+v, want the channel closed", r)
			}
		case <-time.After(time.Second):
			t.Error("Observe after Close: channel not closed")
		}
	})
}
