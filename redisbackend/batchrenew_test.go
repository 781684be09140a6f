package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// batchClients are the clients RenewBatch and HeartbeatBatch are tested on:
// a single real server, and a real server in cluster mode through a
// ClusterClient (one script per hash slot).
func batchClients(t *testing.T) map[string]redisbackend.Client {
	single := testredis.Start(t)
	cluster := testredis.StartConfig(t, testredis.Config{Cluster: true})
	return map[string]redisbackend.Client{
		"server":  single.NewClient(t, nil),
		"cluster": cluster.NewClusterClient(t, nil),
	}
}

// countingHook counts the commands a client sends, pipelined or not.
type countingHook struct{ n int }

func (*countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n++; return next(ctx, cmd) }
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n += len(cmds); return next(ctx, cmds) }
}

func TestRenewBatch(t *testing.T) {
	for name, c := range batchClients(t) {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t, c, nil)
			ctx := context.Background()
			const n = 600 // more than one script's worth of keys
			leases := make([]backend.Lease, n)
			for i := range leases {
				l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("lock/batch/%d", i), HolderID: "me", TTL: 2 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				l.TTL = 30 * time.Second // renew by more than acquired, to see it
				leases[i] = l
			}
			// Lease 7 is released, lease 8 is replaced by another holder's
			// (same holder ID, new token), lease 9 carries a wrong token.
			if err := b.Release(ctx, leases[7]); err != nil {
				t.Fatal(err)
			}
			if err := b.Release(ctx, leases[8]); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: leases[8].Key, HolderID: "me", TTL: 2 * time.Second}); err != nil {
				t.Fatal(err)
			}
			leases[9].Token = backend.NewToken()
			// Lease 10's key is now held by a Shared entry of backend.Modes.
			if err := b.Release(ctx, leases[10]); err != nil {
				t.Fatal(err)
			}
			if _, err := b.AcquireMode(ctx, backend.ModeRequest{Mode: backend.Shared,
				AcquireRequest: backend.AcquireRequest{Key: leases[10].Key, HolderID: "me", TTL: 2 * time.Second}}); err != nil {
				t.Fatal(err)
			}

			// Load the script first, so the count below is of the batch.
			if errs := b.RenewBatch(ctx, leases[:1]); errs[0] != nil {
				t.Fatal(errs[0])
			}
			var hook countingHook
			if h, ok := c.(interface{ AddHook(redis.Hook) }); ok {
				h.AddHook(&hook)
			}
			errs := b.RenewBatch(ctx, leases)
			if len(errs) != n {
				t.Fatalf("got %d errors, want %d", len(errs), n)
			}
			for i, err := range errs {
				switch i {
				case 7, 8, 9, 10:
					if !errors.Is(err, backend.ErrLeaseLost) {
						t.Errorf("lease %d: got %v, want ErrLeaseLost", i, err)
					}
				default:
					if err != nil {
						t.Errorf("lease %d: got %v, want nil", i, err)
					}
				}
			}
			if name == "server" && hook.n > 3 {
				t.Errorf("renewing %d leases on one server sent %d commands, want 3 scripts of at most 256 keys", n, hook.n)
			}
			for _, i := range []int{0, 255, 256, 599} {
				r, err := b.Get(ctx, leases[i].Key)
				if err != nil {
					t.Fatal(err)
				}
				if r.TTL < 20*time.Second || r.Token != leases[i].Token {
					t.Errorf("lease %d after RenewBatch: TTL %v token %s, want about 30s and token %s", i, r.TTL, r.Token, leases[i].Token)
				}
			}
			// The replaced lease kept its new holder's TTL and token.
			r, err := b.Get(ctx, leases[8].Key)
			if err != nil || r.Token == leases[8].Token || r.TTL > 3*time.Second {
				t.Errorf("replaced lease after RenewBatch: %+v, %v; want the new holder's untouched lease", r, err)
			}
		})
	}
}

func TestRenewBatchForeignData(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	b := newBackend(t, c, nil)
	ctx := context.Background()
	good, err := b.Acquire(ctx, backend.AcquireRequest{Key: "good", HolderID: "me", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.Key = "foreign"
	if err := c.Set(ctx, "sovereign:{foreign}", "someone else's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	errs := b.RenewBatch(ctx, []backend.Lease{bad, good})
	if !errors.Is(errs[0], redisbackend.ErrWrongType) || errs[1] != nil {
		t.Fatalf("got %v, want ErrWrongType for the foreign key and nil for the lease", errs)
	}
	if v, _ := c.Get(ctx, "sovereign:{foreign}").Result(); v != "someone else's" {
		t.Errorf("foreign data changed to %q", v)
	}
}

func TestHeartbeatBatch(t *testing.T) {
	for name, c := range batchClients(t) {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t, c, nil)
			ctx := context.Background()
			var reqs []backend.HeartbeatRequest
			for i := range 300 {
				reqs = append(reqs, backend.HeartbeatRequest{Key: fmt.Sprintf("election-%d", i%100), ID: fmt.Sprintf("node-%d", i/100), TTL: 5 * time.Second})
			}
			for i, err := range b.HeartbeatBatch(ctx, reqs) {
				if err != nil {
					t.Errorf("heartbeat %d: %v", i, err)
				}
			}
			for _, key := range []string{"election-0", "election-99"} {
				ms, err := b.Members(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if len(ms) != 3 {
					t.Fatalf("%s: %d members, want 3: %+v", key, len(ms), ms)
				}
				for _, m := range ms {
					if m.TTL <= 0 || m.TTL > 5*time.Second {
						t.Errorf("%s: member %s TTL %v, want within 5s", key, m.ID, m.TTL)
					}
				}
			}
			// Asked again at once, every record still has nearly its whole
			// TTL: nothing is sent.
			h := &countingHook{}
			c.(interface{ AddHook(redis.Hook) }).AddHook(h)
			for i, err := range b.HeartbeatBatch(ctx, reqs) {
				if err != nil {
					t.Errorf("heartbeat %d again: %v", i, err)
				}
			}
			if h.n != 0 {
				t.Errorf("a batch of records written a moment ago sent %d commands, want none", h.n)
			}
			// A record removed through this Backend is written by the next
			// batch, however fresh it was.
			if err := b.RemoveMember(ctx, "election-0", "node-0"); err != nil {
				t.Fatal(err)
			}
			for i, err := range b.HeartbeatBatch(ctx, reqs) {
				if err != nil {
					t.Errorf("heartbeat %d after RemoveMember: %v", i, err)
				}
			}
			if ms, err := b.Members(ctx, "election-0"); err != nil || len(ms) != 3 {
				t.Errorf("members of election-0 after RemoveMember and a batch = %+v, %v; want 3", ms, err)
			}
			bad := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: "", ID: "x", TTL: time.Second}, {Key: "e", ID: "x", TTL: time.Second}})
			if !errors.Is(bad[0], backend.ErrInvalid) || bad[1] != nil {
				t.Errorf("got %v, want ErrInvalid for the empty key only", bad)
			}
		})
	}
}

// TestRenewBatchGroupsBySlot: on a Cluster, keys of different hash tags that
// share a slot are renewed by one script: as many scripts as distinct slots
// (as the server computes them with CLUSTER KEYSLOT), and no CROSSSLOT
// error, which a script mixing slots would get.
func TestRenewBatchGroupsBySlot(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	c := srv.NewClusterClient(t, nil)
	b := newBackend(t, c, nil)
	ctx := context.Background()
	const n = 3000 // over 16384 slots: many slots hold two or more keys
	leases := make([]backend.Lease, n)
	slots := map[int64]bool{}
	for i := range leases {
		key := fmt.Sprintf("election-%d", i)
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "me", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
		slot, err := c.ClusterKeySlot(ctx, "sovereign:{"+key+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
	}
	if len(slots) >= n {
		t.Fatalf("%d keys in %d slots: the test needs keys that share slots", n, len(slots))
	}
	if errs := b.RenewBatch(ctx, leases[:1]); errs[0] != nil { // loads the script
		t.Fatal(errs[0])
	}
	var hook countingHook
	c.AddHook(&hook)
	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
	if hook.n != len(slots) {
		t.Errorf("renewing %d leases in %d slots sent %d scripts, want one per slot", n, len(slots), hook.n)
	}
}
