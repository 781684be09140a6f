package testredis_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/internal/testredis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartRestart(t *testing.T) {
	for _, tc := range []struct {
		name       string
		persistent bool
		wantAfter  string
	}{
		{name: "volatile", persistent: false, wantAfter: ""},
		{name: "persistent", persistent: true, wantAfter: "v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testredis.StartConfig(t, testredis.Config{Persistent: tc.persistent})
			c := s.NewClient(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatalf("SET: got %v, want nil", err)
			}
			s.Restart(t)
			got, err := c.Get(ctx, "k").Result()
			if tc.wantAfter == "" {
				if err == nil {
					t.Fatalf("GET after restart: got %q, want redis.Nil", got)
				}
				return
			}
			if err != nil || got != tc.wantAfter {
				t.Fatalf("GET after restart: got %q, %v; want %q", got, err, tc.wantAfter)
			}
		})
	}
}

func TestStopThenUnreachable(t *testing.T) {
	s := testredis.Start(t)
	c := s.NewClient(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: got %v, want nil", err)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Stop: got nil, want an error")
	}
}

func TestCluster(t *testing.T) {
	s := testredis.StartConfig(t, testredis.Config{Cluster: true})
	c := s.NewClusterClient(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, k := range []string{"a", "b", "{x}1", "{x}2"} {
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s on a one-node cluster: got %v, want nil", k, err)
		}
	}
}

func TestPauseResume(t *testing.T) {
	s := testredis.Start(t)
	c := s.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
	s.Pause(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING to a paused server: got nil, want a timeout")
	}
	s.Resume(t)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := c.Ping(ctx2).Err(); err != nil {
		t.Fatalf("PING after Resume: got %v, want nil", err)
	}
	s.Pause(t) // Stop at cleanup must still end a paused server
}

// TestStepClock: a step moves the server's TIME and its key expiry, as an
// NTP step of its wall clock would, and steps add up.
func TestStepClock(t *testing.T) {
	s := testredis.StartConfig(t, testredis.Config{SteppableClock: true})
	c := s.NewClient(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Set(ctx, "k", "v", 50*time.Second).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	before, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	s.StepClock(t, 30*time.Second)
	after, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	// The step, give or take the time the two calls took.
	if d := after.Sub(before); d < 30*time.Second || d > 35*time.Second {
		t.Errorf("TIME moved by %v across a 30 s step, want 30-35 s", d)
	}
	if ttl, err := c.PTTL(ctx, "k").Result(); err != nil || ttl > 20*time.Second || ttl <= 0 {
		t.Errorf("PTTL after a 30 s step of a 50 s key: %v, %v; want at most 20 s left", ttl, err)
	}
	s.StepClock(t, 30*time.Second)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS after two 30 s steps of a 50 s key: %d, %v; want 0 (expired)", n, err)
	}
	s.StepClock(t, -time.Hour)
	back, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	if d := before.Sub(back); d < 55*time.Minute || d > time.Hour {
		t.Errorf("TIME %v after the steps +30 s, +30 s, -1 h; want about 59 min before %v", back, before)
	}
}
