package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/internal/testredis"
)

func TestPingAnswerTime(t *testing.T) {
	for _, tc := range []struct{ interval, answer, silence time.Duration }{
		{15 * time.Second, 3 * time.Second, 27 * time.Second}, // the default
		{5 * time.Second, time.Second, 9 * time.Second},
		{2 * time.Second, time.Second, 3 * time.Second},
		{time.Second, time.Second, time.Second},
		{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
	} {
		answer := pingAnswerTime(tc.interval)
		if answer != tc.answer || 2*tc.interval-answer != tc.silence {
			t.Errorf("interval %v: answer within %v after %v of silence, want %v after %v",
				tc.interval, answer, 2*tc.interval-answer, tc.answer, tc.silence)
		}
	}
}

// TestWatchPingsOncePerSilence: a quiet watch connection is pinged once per
// two intervals less the answer time, not once per interval, and a server
// that stops answering is still noticed within two intervals. The interval
// is 1 s with an answer time of 200 ms: pings come 1.8 s apart at the
// earliest (a read deadline never fires early), where one per interval
// would make three in about 3 s.
func TestWatchPingsOncePerSilence(t *testing.T) {
	srv := testredis.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := srv.NewClient(t, nil)
	const interval, answer = time.Second, 200 * time.Millisecond
	b, err := New(srv.NewClient(t, nil), &Options{HealthCheckInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	b.pingAnswer = answer                  // before the first Watch starts the receive loop
	p0 := CommandCalls(ctx, admin, "ping") // testredis pings the server when it starts
	start := time.Now()
	ch, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	for CommandCalls(ctx, admin, "ping") < p0+3 {
		select {
		case _, ok := <-ch:
			t.Fatalf("idle watch: got an event or a close (open %v), want nothing", ok)
		case <-ctx.Done():
			t.Fatal("no three pings within a minute")
		case <-time.After(10 * time.Millisecond): // poll the server's count
		}
	}
	silence := 2*interval - answer
	took := time.Since(start)
	if took < 3*silence-50*time.Millisecond {
		t.Errorf("three pings within %v of a quiet watch, want them at least %v apart", took, silence)
	}
	// And no further apart than that (a ping's answer is immediate, and
	// the server's count is polled every 10 ms): a quiet connection that
	// waited longer for its ping would notice a frozen server later than
	// two intervals. 1.5 s of slack for a loaded machine, where pings
	// each waiting one interval longer would take 3 s more.
	if took > 3*silence+1500*time.Millisecond {
		t.Errorf("three pings took %v of a quiet watch, want them about %v apart (%v in all)", took, silence, 3*silence)
	}

	srv.Pause(t)
	defer srv.Resume(t)
	frozen := time.Now()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("got an event from a frozen server")
		}
	case <-ctx.Done():
		t.Fatal("the watch of a frozen server stayed open for a minute")
	}
	took = time.Since(frozen)
	t.Logf("watch closed %v after the server froze", took.Round(time.Millisecond))
	if took > 2*interval+5*time.Second {
		t.Errorf("watch closed %v after the server froze, want within about two intervals (%v)", took, 2*interval)
	}
}

// TestDefaultOptions: the defaults the README gives: prefix "sovereign:",
// WaitTimeout 500 ms, a health-check interval of 15 s (a watch that hears
// nothing is closed within two, 30 s) and TermRetention 1 minute.
func TestDefaultOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer c.Close()
	b, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.prefix != "sovereign:" || b.waitTimeout != 500*time.Millisecond || b.healthCheck != 15*time.Second || b.termKeep != time.Minute {
		t.Errorf("defaults: got prefix %q, WaitTimeout %v, HealthCheckInterval %v, TermRetention %v; want \"sovereign:\", 500ms, 15s, 1m",
			b.prefix, b.waitTimeout, b.healthCheck, b.termKeep)
	}
}
