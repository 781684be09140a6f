package memorybackend_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestRecordTimes: on virtual time, a record reports exactly when its lease
// was acquired and last renewed (a renewal moves RenewedAt, not AcquiredAt),
// and when its holder last sent a heartbeat and how long ago that was; a
// member reports the same heartbeat time and age. Both for a plain lease and
// for an entry of Modes.
func TestRecordTimes(t *testing.T) {
	for _, tt := range []struct {
		name    string
		acquire func(t *testing.T, b *memorybackend.Backend) backend.Lease
		record  func(t *testing.T, b *memorybackend.Backend) backend.Record
	}{
		{"plain", func(t *testing.T, b *memorybackend.Backend) backend.Lease {
			return acquire(t, b, "k", "a", time.Minute)
		}, func(t *testing.T, b *memorybackend.Backend) backend.Record {
			rec, err := b.Get(t.Context(), "k")
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			return rec
		}},
		{"entry", func(t *testing.T, b *memorybackend.Backend) backend.Lease {
			return acquireMode(t, b, modeReq("k", "a", backend.Shared, time.Minute))
		}, func(t *testing.T, b *memorybackend.Backend) backend.Record {
			recs, err := b.Holders(t.Context(), "k")
			if err != nil || len(recs) != 1 {
				t.Fatalf("Holders: got %v, %v; want one record", recs, err)
			}
			return recs[0]
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := memorybackend.New()
				defer b.Close()
				ctx := t.Context()
				t0 := time.Now()
				l := tt.acquire(t, b)
				time.Sleep(3 * time.Second) // virtual time
				if err := b.Renew(ctx, l); err != nil {
					t.Fatalf("Renew: %v", err)
				}
				renewed := time.Now()
				time.Sleep(2 * time.Second)
				if err := b.Heartbeat(ctx, "k", "a", time.Minute); err != nil {
					t.Fatalf("Heartbeat: %v", err)
				}
				beat := time.Now()
				time.Sleep(5 * time.Second)

				rec := tt.record(t, b)
				if !rec.AcquiredAt.Equal(t0) {
					t.Errorf("AcquiredAt: got %v, want %v (the acquisition)", rec.AcquiredAt, t0)
				}
				if !rec.RenewedAt.Equal(renewed) {
					t.Errorf("RenewedAt: got %v, want %v (the renewal, 3s after the acquisition)", rec.RenewedAt, renewed)
				}
				if !rec.HeartbeatAt.Equal(beat) {
					t.Errorf("HeartbeatAt: got %v, want %v", rec.HeartbeatAt, beat)
				}
				if rec.HeartbeatAge != 5*time.Second {
					t.Errorf("HeartbeatAge: got %v, want 5s", rec.HeartbeatAge)
				}
				if rec.TTL != time.Minute-7*time.Second {
					t.Errorf("TTL: got %v, want 53s (a minute from the renewal)", rec.TTL)
				}
				ms, err := b.Members(ctx, "k")
				if err != nil || len(ms) != 1 {
					t.Fatalf("Members: got %v, %v; want one member", ms, err)
				}
				if m := ms[0]; !m.HeartbeatAt.Equal(beat) || m.Age != 5*time.Second || m.TTL != 55*time.Second {
					t.Errorf("member: got HeartbeatAt %v, Age %v, TTL %v; want %v, 5s, 55s", m.HeartbeatAt, m.Age, m.TTL, beat)
				}
			})
		})
	}
}
