package redisbackend_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests provoke many.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// newBackend returns a Backend on client, closed at the end of the test.
func newBackend(t testing.TB, client redisbackend.Client, opts *redisbackend.Options) *redisbackend.Backend {
	t.Helper()
	b, err := redisbackend.New(client, opts)
	if err != nil {
		t.Fatalf("New: got error %v, want nil", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestConformanceMiniredis(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		mr := miniredis.RunT(t)
		// Entries of backend.Modes expire by the server's clock (TIME), which
		// FastForward does not move: Advance moves both.
		now := time.Now()
		mr.SetTime(now)
		return backendtest.Env{
			Open: func() backend.Backend {
				c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
				t.Cleanup(func() { _ = c.Close() })
				b, err := redisbackend.New(c, nil)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return b
			},
			Advance: func(d time.Duration) {
				now = now.Add(d)
				mr.SetTime(now)
				mr.FastForward(d)
			},
			Size:      func() int { return len(mr.Keys()) },
			Retention: time.Minute, // the default TermRetention
			Restart: func(loseData bool) {
				mr.Close() // closes every connection, as a server restart does
				// The restart takes a moment on the server's clock.
				now = now.Add(time.Millisecond)
				mr.SetTime(now)
				mr.FastForward(time.Millisecond)
				if loseData {
					mr.FlushAll()
				}
				if err := mr.Restart(); err != nil {
					t.Fatalf("miniredis Restart: %v", err)
				}
			},
			// Terms come from the server's clock (miniredis: the real one)
			// when the counter is gone.
			TermsSurviveDataLoss: true,
		}
	})
}

// conformanceRetention is the TermRetention of the real-server conformance
// runs, short so that BoundedState waits little.
const conformanceRetention = time.Second

// realEnvs returns the Env factory of the real-server conformance runs:
// one redis-server (a one-node cluster with cluster set) without
// persistence for the whole suite, and a prefix per Env. Restart(false)
// saves a snapshot first (SAVE), which the restarted server loads, as with
// RDB persistence; Restart(true) empties the server and its snapshot before
// restarting it, so the server comes back without the data.
func realEnvs(t *testing.T, cluster bool) func(t *testing.T) backendtest.Env {
	srv := testredis.StartConfig(t, testredis.Config{Cluster: cluster})
	admin := srv.NewClient(t, nil) // on Cluster: the one node
	var n atomic.Int64
	return func(t *testing.T) backendtest.Env {
		ctx := context.Background()
		prefix := fmt.Sprintf("conformance:%d:", n.Add(1))
		opts := &redisbackend.Options{Prefix: prefix, TermRetention: conformanceRetention}
		return backendtest.Env{
			Open: func() backend.Backend {
				var c redisbackend.Client
				if cluster {
					c = srv.NewClusterClient(t, &redis.ClusterOptions{ContextTimeoutEnabled: true})
				} else {
					c = srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
				}
				b, err := redisbackend.New(c, opts)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return b
			},
			Size: func() int { // the keys under this Env's prefix
				keys, err := admin.Keys(ctx, prefix+"*").Result() // test code on a test server
				if err != nil {
					t.Fatalf("KEYS: %v", err)
				}
				return len(keys)
			},
			Retention: conformanceRetention,
			Restart: func(loseData bool) {
				if loseData {
					if err := admin.FlushAll(ctx).Err(); err != nil {
						t.Fatalf("FLUSHALL: %v", err)
					}
				}
				if err := admin.Save(ctx).Err(); err != nil {
					t.Fatalf("SAVE: %v", err)
				}
				srv.Restart(t)
			},
			TermsSurviveDataLoss: true,
		}
	}
}

func TestConformanceRedisServer(t *testing.T) {
	backendtest.Run(t, realEnvs(t, false))
}
