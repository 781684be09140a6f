package redisbackend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sovereign-go/sovereign/internal/testredis"
)

// TestKeySlot: keySlot computes the hash slot a Redis Cluster server does
// (CLUSTER KEYSLOT) for keys with and without hash tags, empty tags,
// unbalanced braces and bytes above 0x7f; and the CRC16 check value of the
// Cluster specification ("123456789" is 0x31C3, slot 12739).
func TestKeySlot(t *testing.T) {
	if got := keySlot("123456789"); got != 12739 {
		t.Fatalf(`keySlot("123456789") = %d, want 12739 (CRC16 0x31C3)`, got)
	}
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	c := srv.NewClusterClient(t, nil)
	ctx := context.Background()
	keys := []string{"", "a", "{", "}", "{}", "{}x", "x{}", "{a}{b}", "a{b}c", "a{b", "a}b{c}", "sovereign:{lock/tally}{/42}", "\xff\x00\x80"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		keys = append(keys, string(b), fmt.Sprintf("sovereign:{election-%d}", rng.IntN(1e6)))
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, server says %d", k, got, want)
		}
	}
}
