package lock_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock/locktest"
	"github.com/sovereign-go/sovereign/memorybackend"
	"github.com/sovereign-go/sovereign/redisbackend"
)

var prefixes atomic.Int64

// TestBackends runs the lock's behaviour (package locktest) over memory,
// miniredis and a real redis-server; etcdbackend's tests run it over an
// embedded etcd.
func TestBackends(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		store := memorybackend.NewStore()
		locktest.Run(t, func(t *testing.T) backend.Backend { return client(t, store) }, 2*time.Second)
	})
	t.Run("memory without Modes", func(t *testing.T) { // the mode cases skip
		store := memorybackend.NewStore()
		locktest.Run(t, func(t *testing.T) backend.Backend { return hidden{client(t, store)} }, 2*time.Second)
	})
	t.Run("memory with Shared only", func(t *testing.T) {
		store := memorybackend.NewStore()
		locktest.Run(t, func(t *testing.T) backend.Backend {
			c := client(t, store)
			c.SetModeSupport(backend.ModeSupport{Shared: true})
			return c
		}, 2*time.Second)
	})
	// miniredis runs every script in a new Lua state, compiling it each
	// time; under -race on a loaded machine the first case's calls took
	// 0.45 s in all once, and with a TTL of 2 s the lock's RequestTimeout
	// (TTL/5, 400 ms) failed the first TryAcquire once with "context
	// deadline exceeded". The cases wait for no expiry, so a TTL of 10 s (requests
	// of up to 2 s) costs them no time and tests the same behaviour;
	// redis-server keeps 2 s.
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		locktest.Run(t, func(t *testing.T) backend.Backend {
			c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { c.Close() })
			return redisBackend(t, c, nil)
		}, 10*time.Second)
	})
	t.Run("redis-server", func(t *testing.T) {
		srv := testredis.Start(t)
		prefix := fmt.Sprintf("locktest:%d:%d:", time.Now().UnixNano(), prefixes.Add(1))
		locktest.Run(t, func(t *testing.T) backend.Backend {
			c := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
			return redisBackend(t, c, &redisbackend.Options{Prefix: prefix})
		}, 2*time.Second)
	})
}

func redisBackend(t *testing.T, c redisbackend.Client, o *redisbackend.Options) backend.Backend {
	b, err := redisbackend.New(c, o)
	if err != nil {
		t.Fatalf("redisbackend.New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
