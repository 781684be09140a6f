package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// repeatingScanner is a server's client whose SCAN returns every name of
// its first batch again in a second batch, as SCAN may when the keyspace is
// resized between calls.
type repeatingScanner struct {
	*redis.Client
	calls int
}

func (s *repeatingScanner) Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd {
	s.calls++
	names, _, err := s.Client.Scan(ctx, 0, match, 1000).Result()
	next := uint64(1) // a second batch follows the first, and ends the scan
	if cursor != 0 {
		next = 0
	}
	return redis.NewScanCmdResult(names, next, err)
}

// TestListReadsANameOnce: a name that SCAN returns twice is read and
// listed once.
func TestListReadsANameOnce(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newTestBackend(t, c)
	for _, key := range []string{"a", "lock/b"} {
		if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "h", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	l := &lister{b: b, prefix: "", pattern: b.listPattern(""), seen: make(map[string]bool)}
	s := &repeatingScanner{Client: c}
	if err := l.scan(ctx, s); err != nil {
		t.Fatal(err)
	}
	if s.calls != 2 {
		t.Fatalf("SCAN calls: got %d, want 2", s.calls)
	}
	var keys []string
	for _, r := range l.recs {
		keys = append(keys, r.Key)
	}
	if len(keys) != 2 {
		t.Errorf("records listed from two SCAN batches of the same 2 names: got keys %q, want each of a and lock/b once", keys)
	}
}
