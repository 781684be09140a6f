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
			Advance: mr.FastForward,
		}
	})
}

func TestConformanceRedisServer(t *testing.T) {
	srv := testredis.Start(t)
	var n atomic.Int64
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		// A prefix per subtest keeps subtests independent on one server.
		prefix := fmt.Sprintf("conformance:%d:%d:", time.Now().UnixNano(), n.Add(1))
		return backendtest.Env{
			Open: func() backend.Backend {
				c := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
				b, err := redisbackend.New(c, &redisbackend.Options{Prefix: prefix})
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return b
			},
		}
	})
}
