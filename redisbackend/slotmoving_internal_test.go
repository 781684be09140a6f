package redisbackend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/internal/testredis"
)

// TestWatchRefusesSlotLeftNode: after a node dropped the subscriptions of a
// slot (its SUNSUBSCRIBE, noted by movedLocked) a Watch of that slot is
// refused with errSlotMoving while the reloaded slot map still names that
// node, as it does when the node asked has not yet learnt of the move, even
// when the node's role is not due to be asked again; a Watch of another
// slot is not. Here the map names the node because the slot never moved: a
// one-node cluster whose drop the test notes by hand.
func TestWatchRefusesSlotLeftNode(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(srv.NewClusterClient(t, nil), &Options{Prefix: "slm:"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	channel := b.channel("k")
	node, err := b.cluster.MasterForKey(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	addr := node.Options().Addr
	b.hubs.mu.Lock()
	b.movedLocked(keySlot(channel), addr)
	b.hubs.roleAt[addr] = time.Now().Add(time.Hour) // not due: only the drop refuses
	b.hubs.mu.Unlock()
	for i := range 2 {
		if _, err := b.Watch(ctx, "k"); !errors.Is(err, errSlotMoving) {
			t.Fatalf("Watch %d of the slot its node dropped, the map naming that node: got %v, want errSlotMoving", i+1, err)
		}
	}
	other := "o"
	for keySlot(b.channel(other)) == keySlot(channel) {
		other += "o"
	}
	if _, err := b.Watch(ctx, other); err != nil {
		t.Fatalf("Watch of a key in another slot: got %v, want nil", err)
	}
}

// TestWatchReloadsMapAfterDrop: after a node dropped our subscriptions of a
// slot, the next Watch reloads the client's slot map first, whatever its
// slot (the drop means the map is out of date: a failover moves every slot
// of the node), and only the next: a later Watch does not reload it again.
// The reloads are counted on the server (CLUSTER SLOTS or SHARDS).
func TestWatchReloadsMapAfterDrop(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := srv.NewClient(t, nil)
	b, err := New(srv.NewClusterClient(t, nil), &Options{Prefix: "rl:"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	reloads := func() int {
		return CommandCalls(ctx, admin, "cluster|slots") + CommandCalls(ctx, admin, "cluster|shards")
	}
	node, err := b.cluster.MasterForKey(ctx, b.channel("dropped")) // loads the map
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"dropped"} // then two keys of other slots
	for k := "a"; len(keys) < 3; k += "a" {
		if s := keySlot(b.channel(k)); s != keySlot(b.channel(keys[0])) && (len(keys) < 2 || s != keySlot(b.channel(keys[1]))) {
			keys = append(keys, k)
		}
	}
	b.hubs.mu.Lock()
	b.movedLocked(keySlot(b.channel(keys[0])), node.Options().Addr)
	b.hubs.mu.Unlock()
	before := reloads()
	if _, err := b.Watch(ctx, keys[1]); err != nil {
		t.Fatalf("Watch of another slot after the drop: %v", err)
	}
	if n := reloads() - before; n < 1 {
		t.Errorf("slot map reloads by the first Watch after the drop: got %d, want at least 1", n)
	}
	before = reloads()
	if _, err := b.Watch(ctx, keys[2]); err != nil {
		t.Fatalf("second Watch after the drop: %v", err)
	}
	if n := reloads() - before; n != 0 {
		t.Errorf("slot map reloads by the second Watch after the drop: got %d, want 0", n)
	}
}
