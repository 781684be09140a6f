package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// The batch calls on a Redis Cluster go one script per master (see
// nodebatch.go), on three real masters here.

// nodeBatchSetup acquires n leases ("election-<i>", TTL 2 s) on a backend
// whose Cluster client has a counting hook added afterwards, and returns
// them with the addresses of the master serving each one's slot.
func nodeBatchSetup(t *testing.T, c *testredis.Cluster, n int) (*redisbackend.Backend, *redis.ClusterClient, *countingHook, []backend.Lease, []string) {
	t.Helper()
	ctx := context.Background()
	cc := clusterClient(t, c)
	b := newBackend(t, cc, nil)
	leases := make([]backend.Lease, n)
	masters := make([]string, n)
	for i := range leases {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("election-%d", i), HolderID: "me", TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		l.TTL = 30 * time.Second // renewed by more than acquired, to see it
		leases[i] = l
		slot := slotOf(t, ctx, c, "sovereign:", l.Key)
		m, _, err := c.Shard(ctx, c.Addrs()[0], slot)
		if err != nil {
			t.Fatal(err)
		}
		masters[i] = m
	}
	// Load the scripts on every master (NOSCRIPT, then EVAL), before counting.
	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
	var reqs []backend.HeartbeatRequest
	for _, l := range leases {
		reqs = append(reqs, backend.HeartbeatRequest{Key: l.Key, ID: "other", TTL: 5 * time.Second})
	}
	for i, err := range b.HeartbeatBatch(ctx, reqs) {
		if err != nil {
			t.Fatalf("heartbeat %d: %v", i, err)
		}
	}
	hook := &countingHook{}
	cc.AddHook(hook)
	return b, cc, hook, leases, masters
}

// nodeScriptRuns returns the scripts the masters of c have run (EVALSHA and
// EVAL, from INFO commandstats): neither a call refused with a redirection
// nor one that failed (NOSCRIPT, before the script is sent whole) counts.
func nodeScriptRuns(t *testing.T, c *testredis.Cluster) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, a := range c.Addrs() {
		info, err := c.Node(a).NewClient(t, nil).Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if i := strings.Index(info, cmd); i >= 0 {
				var calls, rejected, failed int
				var usec, per float64
				if _, err := fmt.Sscanf(info[i+len(cmd):], "calls=%d,usec=%f,usec_per_call=%f,rejected_calls=%d,failed_calls=%d",
					&calls, &usec, &per, &rejected, &failed); err != nil {
					t.Fatalf("%s: %v", cmd, err)
				}
				n += calls - failed
			}
		}
	}
	return n
}

// renewedAll checks that every lease has a TTL near 30 s (renewed from 2).
func renewedAll(t *testing.T, cc *redis.ClusterClient, leases []backend.Lease) {
	t.Helper()
	ctx := context.Background()
	for i, l := range leases {
		d, err := cc.PTTL(ctx, "sovereign:{"+l.Key+"}").Result()
		if err != nil || d < 20*time.Second {
			t.Errorf("lease %d (%s) after RenewBatch: PTTL %v, %v; want about 30s", i, l.Key, d, err)
		}
	}
}

// TestNodeBatchesOnThreeMasters: 1,000 leases spread over the slots of
// three masters are renewed, and 1,000 heartbeat records written, by one
// script per master per 256 items, not one per slot (about 970 here).
func TestNodeBatchesOnThreeMasters(t *testing.T) {
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 3})
	const n = 1000
	b, cc, hook, leases, masters := nodeBatchSetup(t, c, n)
	ctx := context.Background()
	perMaster := map[string]int{}
	for _, m := range masters {
		perMaster[m]++
	}
	want := 0
	for _, k := range perMaster {
		want += (k + 255) / 256
	}
	if len(perMaster) != 3 {
		t.Fatalf("the leases are on %d masters, want 3", len(perMaster))
	}

	// A renewal watch on the first lease of each master hears its renewal
	// (published from the master's script, on the key's own channel).
	watched := map[string]<-chan backend.Event{}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, m := range masters {
		if _, ok := watched[m]; !ok {
			ch, err := b.WatchRenewals(wctx, leases[i].Key, nil)
			if err != nil {
				t.Fatal(err)
			}
			watched[m] = ch
		}
	}
	hook.n = 0
	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
	if hook.n != want {
		t.Errorf("RenewBatch of %d leases on 3 masters (%v) sent %d scripts, want %d", n, perMaster, hook.n, want)
	}
	renewedAll(t, cc, leases)
	for m, ch := range watched {
		select {
		case ev := <-ch:
			if ev.Type != backend.EventRenewed || ev.TTL != 30*time.Second {
				t.Errorf("watch of a lease on %s: got %+v, want EventRenewed with TTL 30s", m, ev)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("watch of a lease on %s: no renewal event within 10s", m)
		}
	}

	var reqs []backend.HeartbeatRequest
	for _, l := range leases {
		reqs = append(reqs, backend.HeartbeatRequest{Key: l.Key, ID: "new", TTL: 7 * time.Second})
	}
	hook.n = 0
	for i, err := range b.HeartbeatBatch(ctx, reqs) {
		if err != nil {
			t.Fatalf("heartbeat %d: %v", i, err)
		}
	}
	if hook.n != want {
		t.Errorf("HeartbeatBatch of %d records on 3 masters sent %d scripts, want %d", n, hook.n, want)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		ms, err := b.Members(ctx, leases[i].Key)
		if err != nil || len(ms) != 2 {
			t.Errorf("members of %s: %+v, %v; want the records of other and new", leases[i].Key, ms, err)
		}
	}
}

// TestNodeBatchesAcrossSlotMoves: slots move to another master behind the
// Cluster client's back (its slot map still names the old masters). The
// items a master does not serve answer MOVED and go again, alone, in
// scripts of their slots, which the Cluster client redirects: every lease
// is renewed and every record written, with no error.
//   - A slot halfway through its move (its keys on the target, the slot
//     still the source's: ASK), in the middle of a master's call: only its
//     items go again.
//   - The slot of the first key of a master's call, fully moved: the call
//     is redirected whole to a master that serves none of its other keys,
//     which all go again.
func TestNodeBatchesAcrossSlotMoves(t *testing.T) {
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 3})
	const n = 300
	b, cc, _, leases, masters := nodeBatchSetup(t, c, n)
	ctx := context.Background()
	other := func(m string) string {
		for _, a := range c.Addrs() {
			if a != m {
				if r, err := c.Node(a).NewClient(t, nil).Do(ctx, "ROLE").Slice(); err == nil && r[0] == "master" {
					return a
				}
			}
		}
		t.Fatalf("no master other than %s", m)
		return ""
	}
	renew := func(leases []backend.Lease) int {
		t.Helper()
		before := nodeScriptRuns(t, c)
		for i, err := range b.RenewBatch(ctx, leases) {
			if err != nil {
				t.Errorf("lease %d: %v", i, err)
			}
		}
		renewedAll(t, cc, leases)
		return nodeScriptRuns(t, c) - before
	}

	// Halfway: a lease that is not the first of its master's leases.
	h, seen := 0, map[string]bool{}
	for i, m := range masters {
		if m != masters[0] && seen[m] {
			h = i
			break
		}
		seen[m] = true
	}
	var call []backend.Lease // h's master's leases: one node call
	inSlot := 0              // of them, those in h's slot
	hSlot := slotOf(t, ctx, c, "sovereign:", leases[h].Key)
	for i, l := range leases {
		if masters[i] == masters[h] {
			call = append(call, l)
			if slotOf(t, ctx, c, "sovereign:", l.Key) == hSlot {
				inSlot++
			}
		}
	}
	if call[0].Key == leases[h].Key {
		t.Fatalf("lease %d is the first of its master's call", h)
	}
	to := other(masters[h])
	if _, err := c.MigrateKeys(ctx, hSlot, to); err != nil {
		t.Fatal(err)
	}
	// The node's script, then each item of the moving slot in a script of
	// its slot, which the source refuses (ASK) and the target runs.
	if got, want := renew(call), 1+inSlot; got != want {
		t.Errorf("renewing %d leases of one master, %d of them in a slot halfway through its move, ran %d scripts, want %d: the node's script, and only the moved items again", len(call), inSlot, got, want)
	}

	// A new record in a slot halfway through its move is refused
	// (TRYAGAIN: some keys of the call are on the target, some not), by
	// slot as by node. The move is finished, leaving the map stale.
	if err := c.FinishMigration(ctx, hSlot, masters[h], to); err != nil {
		t.Fatal(err)
	}

	// Fully: the slot of lease 0, the first key of its master's call.
	slot0 := slotOf(t, ctx, c, "sovereign:", leases[0].Key)
	if _, err := c.MigrateSlot(ctx, slot0, other(masters[0])); err != nil {
		t.Fatal(err)
	}
	t.Logf("RenewBatch of all %d leases after the moves: %d scripts run", n, renew(leases))

	var reqs []backend.HeartbeatRequest
	for _, l := range leases {
		reqs = append(reqs, backend.HeartbeatRequest{Key: l.Key, ID: "new", TTL: 7 * time.Second})
	}
	for i, err := range b.HeartbeatBatch(ctx, reqs) {
		if err != nil {
			t.Errorf("heartbeat %d: %v", i, err)
		}
	}
	for _, i := range []int{0, h} {
		ms, err := b.Members(ctx, leases[i].Key)
		if err != nil || len(ms) != 2 {
			t.Errorf("members of %s (moved): %+v, %v; want the records of other and new", leases[i].Key, ms, err)
		}
	}
}

// TestNodeBatchForeignData: in a master's script, a key of ours that holds
// foreign data is reported (ErrWrongType), not taken for a key served
// elsewhere, and the other leases of the call are renewed.
func TestNodeBatchForeignData(t *testing.T) {
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 3})
	b, cc, _, leases, _ := nodeBatchSetup(t, c, 30)
	ctx := context.Background()
	bad := leases[5]
	bad.Key = "foreign"
	if err := cc.Set(ctx, "sovereign:{foreign}", "someone else's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	errs := b.RenewBatch(ctx, append([]backend.Lease{bad}, leases...))
	if !errors.Is(errs[0], redisbackend.ErrWrongType) {
		t.Errorf("the foreign key: got %v, want ErrWrongType", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("lease %d: %v", i, err)
		}
	}
	renewedAll(t, cc, leases)
	if v, _ := cc.Get(ctx, "sovereign:{foreign}").Result(); v != "someone else's" {
		t.Errorf("foreign data changed to %q", v)
	}
}
