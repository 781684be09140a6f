package redisbackend_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// cannedHook answers every command itself, without a connection, as the
// server answers a pair on a free key: the release script (the EVALSHA
// with one key) with 1, the acquire script (two keys) with a new term.
type cannedHook struct{ n int64 }

func (h *cannedHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		panic("cannedHook: dial")
	}
}

func (h *cannedHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c := cmd.(*redis.Cmd)
		if numKeys, _ := c.Args()[2].(int); numKeys == 1 {
			c.SetVal(int64(1))
			return nil
		}
		h.n++
		c.SetVal(1_000_000 + h.n)
		return nil
	}
}

func (h *cannedHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// BenchmarkClientPath measures the client side of a pair alone: the CPU
// time and the allocations of Acquire + Release ("backend") and of package
// lock's TryAcquire + Release ("lock") through a real go-redis client
// configured as the bench's, whose commands a hook answers without I/O.
// Everything a pair costs this process but the socket, the wait and the
// runtime's parking and waking is in it: the figure to cut when working on
// the client code, free of the server's and the machine's noise.
//
//	go test -run '^$' -bench BenchmarkClientPath ./redisbackend
func BenchmarkClientPath(b *testing.B) {
	ctx := context.Background()
	newBackend := func(b *testing.B) *redisbackend.Backend {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, DisableIdentity: true})
		b.Cleanup(func() { _ = c.Close() })
		c.AddHook(&cannedHook{})
		rb, err := redisbackend.New(c, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = rb.Close() })
		return rb
	}
	b.Run("backend", func(b *testing.B) {
		rb := newBackend(b)
		b.ReportAllocs()
		for b.Loop() {
			l, err := rb.Acquire(ctx, backend.AcquireRequest{Key: lock.Prefix + "k", HolderID: "bench", TTL: 10 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			if err := rb.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("lock", func(b *testing.B) {
		rb := newBackend(b)
		l, err := lock.New(rb, "bench", &lock.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		b.ReportAllocs()
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, "k", nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
