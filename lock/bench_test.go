package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// BenchmarkPair measures what package lock adds to a TryAcquire + Release
// pair, on the memory backend (no network): compare "locker" with
// "backend", the backend's Acquire + Release alone.
//
//	go test -run '^$' -bench BenchmarkPair -benchmem ./lock
func BenchmarkPair(b *testing.B) {
	ctx := context.Background()
	b.Run("locker", func(b *testing.B) {
		m := memorybackend.New()
		defer m.Close()
		l, err := lock.New(m, "me", &lock.Options{Logger: quiet})
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
	b.Run("backend", func(b *testing.B) {
		m := memorybackend.New()
		defer m.Close()
		req := backend.AcquireRequest{Key: backend.LockKeyPrefix + "k", HolderID: "me", TTL: 10 * time.Second}
		b.ReportAllocs()
		for b.Loop() {
			l, err := m.Acquire(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if err := m.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
	})
}
