package etcdbackend_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// benchBackend returns a backend on the shared server whose client counts
// its requests, and the counter, reset.
func benchBackend(b *testing.B) (*etcdbackend.Backend, *counter) {
	b.Helper()
	var n counter
	be := newBackend(b, newClient(b, nil, n.configure), &etcdbackend.Options{Prefix: newPrefix()})
	return be, &n
}

// reportRequests reports the requests per operation counted since reset.
func reportRequests(b *testing.B, n *counter) {
	b.ReportMetric(float64(n.total())/float64(b.N), "requests/op")
}

// BenchmarkAcquireRelease measures acquire+release pairs on one key, one
// after another, against the embedded one-member server.
func BenchmarkAcquireRelease(b *testing.B) {
	be, n := benchBackend(b)
	ctx := b.Context()
	req := backend.AcquireRequest{Key: "bench", HolderID: "a", TTL: 10 * time.Second}
	n.reset()
	start := time.Now()
	for b.Loop() {
		l, err := be.Acquire(ctx, req)
		if err != nil {
			b.Fatalf("Acquire: %v", err)
		}
		if err := be.Release(ctx, l); err != nil {
			b.Fatalf("Release: %v", err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
	reportRequests(b, n)
}

// BenchmarkRenew measures one owner-checked renewal.
func BenchmarkRenew(b *testing.B) {
	be, n := benchBackend(b)
	ctx := b.Context()
	l, err := be.Acquire(ctx, backend.AcquireRequest{Key: "bench", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		b.Fatalf("Acquire: %v", err)
	}
	n.reset()
	for b.Loop() {
		if err := be.Renew(ctx, l); err != nil {
			b.Fatalf("Renew: %v", err)
		}
	}
	reportRequests(b, n)
}

// BenchmarkHeartbeat measures the refresh of a heartbeat record.
func BenchmarkHeartbeat(b *testing.B) {
	be, n := benchBackend(b)
	ctx := b.Context()
	if err := be.Heartbeat(ctx, "bench", "a", 10*time.Second); err != nil {
		b.Fatalf("Heartbeat: %v", err)
	}
	n.reset()
	for b.Loop() {
		if err := be.Heartbeat(ctx, "bench", "a", 10*time.Second); err != nil {
			b.Fatalf("Heartbeat: %v", err)
		}
	}
	reportRequests(b, n)
}

// BenchmarkGet measures reading a held key's record with the holder's
// heartbeat.
func BenchmarkGet(b *testing.B) {
	be, n := benchBackend(b)
	ctx := b.Context()
	if err := be.Heartbeat(ctx, "bench", "a", 10*time.Second); err != nil {
		b.Fatalf("Heartbeat: %v", err)
	}
	if _, err := be.Acquire(ctx, backend.AcquireRequest{Key: "bench", HolderID: "a", TTL: 10 * time.Second}); err != nil {
		b.Fatalf("Acquire: %v", err)
	}
	n.reset()
	for b.Loop() {
		if _, err := be.Get(ctx, "bench"); err != nil {
			b.Fatalf("Get: %v", err)
		}
	}
	reportRequests(b, n)
}

// BenchmarkAcquireHeld measures a failed acquisition, which doubles as a read
// of the holder's record.
func BenchmarkAcquireHeld(b *testing.B) {
	be, n := benchBackend(b)
	ctx := b.Context()
	if _, err := be.Acquire(ctx, backend.AcquireRequest{Key: "bench", HolderID: "a", TTL: 10 * time.Second}); err != nil {
		b.Fatalf("Acquire: %v", err)
	}
	n.reset()
	for b.Loop() {
		_, err := be.Acquire(ctx, backend.AcquireRequest{Key: "bench", HolderID: "b", TTL: 10 * time.Second})
		if !errors.Is(err, backend.ErrHeld) {
			b.Fatalf("Acquire of a held key: got %v, want ErrHeld", err)
		}
	}
	reportRequests(b, n)
}

// BenchmarkAcquireModeRelease measures AcquireMode+Release pairs on one key
// in each mode, one after another, against the embedded one-member server.
func BenchmarkAcquireModeRelease(b *testing.B) {
	for _, bm := range []struct {
		name string
		req  backend.ModeRequest
	}{
		{"exclusive", backend.ModeRequest{Mode: backend.Exclusive}},
		{"shared", backend.ModeRequest{Mode: backend.Shared}},
		{"semaphore-of-3", backend.ModeRequest{Mode: backend.Shared, Limit: 3}},
		{"semaphore-of-64", backend.ModeRequest{Mode: backend.Shared, Limit: etcdbackend.MaxLimit}},
		{"exclusive-2-ancestors", backend.ModeRequest{Mode: backend.Exclusive, Ancestors: []string{"a", "a/b"}}},
		{"exclusive-fair-waitid", backend.ModeRequest{Mode: backend.Exclusive, Fair: true, WaitID: "w"}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			be, n := benchBackend(b)
			ctx := b.Context()
			req := bm.req
			req.AcquireRequest = backend.AcquireRequest{Key: "a/b/c", HolderID: "a", TTL: 10 * time.Second}
			n.reset()
			start, cpu0 := time.Now(), cpuTime()
			for b.Loop() {
				l, err := be.AcquireMode(ctx, req)
				if err != nil {
					b.Fatalf("AcquireMode: %v", err)
				}
				if err := be.Release(ctx, l); err != nil {
					b.Fatalf("Release: %v", err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			reportRequests(b, n)
		})
	}
}
