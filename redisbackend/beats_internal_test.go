package redisbackend

import (
	"testing"
	"time"
)

// A batch writes a record only when it would otherwise have a quarter of its
// TTL or less left at the next batch, expected after the last gap between
// batches; anything unknown (first request, another TTL, a failed write)
// writes.
func TestBeatsWriteOnlyWhatNeedsIt(t *testing.T) {
	for _, tc := range []struct {
		name          string
		ttl, interval time.Duration
		writes        []int // batch numbers (0-based) that write, of 13
	}{
		{"elector defaults at TTL 10s", 15 * time.Second, 5 * time.Second, []int{0, 2, 4, 6, 8, 10, 12}},
		{"elector defaults at TTL 2s", 7 * time.Second, time.Second, []int{0, 5, 10}},
		{"interval near the TTL", 4 * time.Second, 3 * time.Second, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s beats
			t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
			var got []int
			for i := range 13 {
				now := t0.Add(time.Duration(i) * tc.interval)
				if !s.fresh(bk("k"), tc.ttl, now) {
					got = append(got, i)
					s.wrote(bk("k"), tc.ttl, now)
				}
				// The record never has less than a quarter of its TTL
				// left when the next batch comes.
				if left := s.m[bk("k")].written.Add(tc.ttl).Sub(now.Add(tc.interval)); left < tc.ttl/4 && i < 12 {
					t.Fatalf("batch %d: the record would have %v left at the next batch", i, left)
				}
			}
			if len(got) != len(tc.writes) {
				t.Fatalf("batches writing: %v, want %v", got, tc.writes)
			}
			for i := range got {
				if got[i] != tc.writes[i] {
					t.Fatalf("batches writing: %v, want %v", got, tc.writes)
				}
			}
		})
	}

	t.Run("unknown, changed TTL, forgotten, swept", func(t *testing.T) {
		var s beats
		now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
		if s.fresh(bk("k"), 15*time.Second, now) {
			t.Fatal("a record never written is fresh")
		}
		s.wrote(bk("k"), 15*time.Second, now)
		now = now.Add(time.Second)
		if !s.fresh(bk("k"), 15*time.Second, now) {
			t.Fatal("a record written a second ago, batches a second apart, is not fresh")
		}
		if s.fresh(bk("k"), 20*time.Second, now) {
			t.Fatal("a record asked for with another TTL is fresh")
		}
		s.forget(bk("k"))
		if s.fresh(bk("k"), 15*time.Second, now) {
			t.Fatal("a forgotten record (failed write) is fresh")
		}
		s.wrote(bk("k"), 15*time.Second, now)
		s.wrote(bk("gone"), 15*time.Second, now)
		now = now.Add(2 * time.Minute) // "gone" not asked for since
		s.fresh(bk("k"), 15*time.Second, now)
		if _, ok := s.m[bk("gone")]; ok {
			t.Error("a record nobody asked for during twice its TTL was not swept")
		}
	})
}

// A leader's renewals refresh its record just often enough that no batch
// has to write it, whatever the phase between renewals and batches: after
// the first batch, batches write nothing, renewals refresh less often than
// they come, and the record never runs short.
func TestBeatsRenewalsCoverBatches(t *testing.T) {
	for _, tc := range []struct {
		name               string
		ttl, batch, renew  time.Duration
		maxRefreshesPerMin int
	}{
		{"elector defaults at TTL 10s", 15 * time.Second, 5 * time.Second, 10 * time.Second / 3, 12},
		{"elector defaults at TTL 2s", 7 * time.Second, time.Second, 2 * time.Second / 3, 16},
		{"renewals slower than batches", 15 * time.Second, 2 * time.Second, 3 * time.Second, 20},
	} {
		for phase := range 8 {
			t.Run(tc.name, func(t *testing.T) {
				var s beats
				t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
				nextBatch := t0
				nextRenew := t0.Add(time.Duration(phase) * tc.renew / 8)
				end := t0.Add(10 * time.Minute)
				var expires time.Time
				writes, refreshes := 0, 0
				for nextBatch.Before(end) || nextRenew.Before(end) {
					now := nextRenew
					if nextBatch.Before(nextRenew) || nextBatch.Equal(nextRenew) {
						now = nextBatch
						nextBatch = nextBatch.Add(tc.batch)
						if !s.fresh(bk("k"), tc.ttl, now) {
							if writes > 0 {
								t.Errorf("batch at %v wrote the record (refreshed %v ago by renewals)", now.Sub(t0), now.Sub(expires.Add(-tc.ttl)))
							}
							writes++
							s.wrote(bk("k"), tc.ttl, now)
							expires = now.Add(tc.ttl)
						}
					} else {
						nextRenew = nextRenew.Add(tc.renew)
						if ttl, ok := s.renewal(bk("k"), now); ok {
							refreshes++
							s.refreshed(bk("k"), ttl, now)
							expires = now.Add(ttl)
						}
					}
					if !expires.IsZero() && expires.Sub(now) <= tc.ttl/4 {
						t.Fatalf("at %v the record has %v left", now.Sub(t0), expires.Sub(now))
					}
				}
				if perMin := refreshes / 10; perMin > tc.maxRefreshesPerMin {
					t.Errorf("phase %d/8: %d refreshes a minute, want at most %d (renewals: %d a minute)", phase, perMin, tc.maxRefreshesPerMin, int(time.Minute/tc.renew))
				}
				t.Logf("phase %d/8: %d refreshes a minute, renewals %d", phase, refreshes/10, int(time.Minute/tc.renew))
			})
		}
	}
}

// bk names the record of ID "i" for key.
func bk(key string) beatKey { return beatKey{key: key, id: "i"} }
