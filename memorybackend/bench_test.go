package memorybackend_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// BenchmarkPlainCycle measures one Acquire, Renew, Get and Release of a
// lease, over 64 keys: the path Modes must leave as it was.
func BenchmarkPlainCycle(b *testing.B) {
	c := memorybackend.New()
	defer c.Close()
	ctx := b.Context()
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	for i := 0; b.Loop(); i++ {
		l, err := c.Acquire(ctx, backend.AcquireRequest{Key: keys[i%len(keys)], HolderID: "a", TTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Renew(ctx, l); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Get(ctx, l.Key); err != nil {
			b.Fatal(err)
		}
		if err := c.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSharedCycle measures the same cycle for a Shared entry with a
// limit and two ancestors, next to two other live Shared holders.
func BenchmarkSharedCycle(b *testing.B) {
	c := memorybackend.New()
	defer c.Close()
	ctx := b.Context()
	req := func(id string) backend.ModeRequest {
		return backend.ModeRequest{
			AcquireRequest: backend.AcquireRequest{Key: "lock/a/b/c", HolderID: id, TTL: time.Minute},
			Mode:           backend.Shared,
			Limit:          3,
			Ancestors:      []string{"lock/a", "lock/a/b"},
		}
	}
	for _, id := range []string{"x", "y"} {
		if _, err := c.AcquireMode(ctx, req(id)); err != nil {
			b.Fatal(err)
		}
	}
	r := req("a")
	for b.Loop() {
		l, err := c.AcquireMode(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Renew(ctx, l); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Get(ctx, l.Key); err != nil {
			b.Fatal(err)
		}
		if err := c.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
}
