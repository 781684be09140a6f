package redisbackend_test

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestMembersPrunesGoneIDs: Members drops from the members index the IDs
// whose heartbeat record is gone, so that an index kept alive by a live
// member does not keep every departed ID with it (found by a mutation that
// every test survived: the SREM of membersScript left out).
func TestMembersPrunesGoneIDs(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "prune:"})
	ctx := ctxBound(t)
	for _, id := range []string{"a", "b"} {
		if err := b.Heartbeat(ctx, "k", id, time.Minute); err != nil {
			t.Fatalf("Heartbeat %s: %v", id, err)
		}
	}
	// a's record vanishes (as at its expiry) while b's lives.
	if err := c.Del(ctx, "prune:{k}:heartbeat:a").Err(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	ms, err := b.Members(ctx, "k")
	if err != nil || len(ms) != 1 || ms[0].ID != "b" {
		t.Fatalf("Members: got %v, %v; want [b], nil", ms, err)
	}
	got, err := c.SMembers(ctx, "prune:{k}:members").Result()
	if err != nil || !slices.Equal(got, []string{"b"}) {
		t.Fatalf("SMEMBERS of the index after Members: got %v, %v; want [b] (a pruned)", got, err)
	}
}

// TestMembersSortedByID: Members returns its records sorted by ID, whatever
// order the set yields them in: 40 IDs, some numeric (a set of integers is
// stored apart), heartbeated in a shuffled order.
func TestMembersSortedByID(t *testing.T) {
	srv := testredis.Start(t)
	b := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: "sorted:"})
	ctx := ctxBound(t)
	var ids []string
	for i := range 20 {
		ids = append(ids, "node-"+strconv.Itoa(i*7919%1000), strconv.Itoa(i*104729%100000))
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for _, id := range ids {
		if err := b.Heartbeat(ctx, "k", id, time.Minute); err != nil {
			t.Fatalf("Heartbeat %s: %v", id, err)
		}
	}
	ms, err := b.Members(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.ID)
	}
	want := slices.Clone(ids)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Members: got IDs %q, want %q (sorted)", got, want)
	}
}
