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

// TestRenewBatchOneScriptPerMaster: on a Cluster, the leases one master
// serves are renewed by one script per 256 of them, whatever their slots:
// 3,000 leases in about 2,800 slots of a one-node Cluster take 12 scripts
// (one per slot, 2,776 here, before), with no CROSSSLOT error, which a
// script naming keys of several slots in KEYS would get.
// TestNodeBatchesOnThreeMasters covers three masters and moving slots.
func TestRenewBatchOneScriptPerMaster(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	c := srv.NewClusterClient(t, nil)
	b := newBackend(t, c, nil)
	ctx := context.Background()
	const n = 3000 // over 16384 slots: many slots, some holding two or more keys
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
	if len(slots) < n/2 {
		t.Fatalf("%d keys in %d slots: the test needs keys in many slots", n, len(slots))
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
	if want := (n + 255) / 256; hook.n != want {
		t.Errorf("renewing %d leases in %d slots of one master sent %d scripts, want %d (256 leases a script)", n, len(slots), hook.n, want)
	}
}

// TestRenewBatchEntriesAndWait: RenewBatch renews a lease of
// backend.Modes (an entry, not a plain lease hash) as Renew does, and with
// Options.WaitReplicas every renewal waits for the replicas as Renew does:
// on a server without replicas each one fails with ErrNotReplicated rather
// than reporting a write no replica confirmed.
func TestRenewBatchEntriesAndWait(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "rbe:"})
	plain, err := b.Acquire(ctx, backend.AcquireRequest{Key: "plain", HolderID: "me", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	entry, err := b.AcquireMode(ctx, backend.ModeRequest{Mode: backend.Shared,
		AcquireRequest: backend.AcquireRequest{Key: "lock/r/e", HolderID: "me", TTL: 2 * time.Second},
		Ancestors:      []string{"lock/r"}})
	if err != nil {
		t.Fatal(err)
	}
	plain.TTL, entry.TTL = time.Minute, time.Minute // renewed by more than acquired, to see it
	for i, err := range b.RenewBatch(ctx, []backend.Lease{plain, entry}) {
		if err != nil {
			t.Errorf("RenewBatch, lease %d: got %v, want nil", i, err)
		}
	}
	for _, key := range []string{"plain", "lock/r/e"} {
		r, err := b.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get %q: %v", key, err)
		}
		if r.TTL <= 50*time.Second {
			t.Errorf("%q after RenewBatch: TTL %v, want about 1m", key, r.TTL)
		}
	}

	waiting := newBackend(t, c, &redisbackend.Options{Prefix: "rbe:", WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	for i, err := range waiting.RenewBatch(ctx, []backend.Lease{plain, entry}) {
		if !errors.Is(err, redisbackend.ErrNotReplicated) {
			t.Errorf("RenewBatch with WaitReplicas 1 and no replica, lease %d: got %v, want ErrNotReplicated", i, err)
		}
	}
}

// TestBatchesRefuseInvalidAndClosed: RenewBatch and HeartbeatBatch check
// each item as Renew and Heartbeat do (an error wrapping backend.ErrInvalid
// for that item alone, nothing sent for it: a renewal with TTL 0 would
// otherwise end the lease), and after Close every item fails with
// backend.ErrClosed.
func TestBatchesRefuseInvalidAndClosed(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b, err := redisbackend.New(c, &redisbackend.Options{Prefix: "rbi:"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "me", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	zero := l
	zero.TTL = 0
	braced := l
	braced.Key = "a{b"
	errs := b.RenewBatch(ctx, []backend.Lease{zero, braced, l})
	for i := range 2 {
		if !errors.Is(errs[i], backend.ErrInvalid) {
			t.Errorf("RenewBatch of invalid lease %d: got %v, want ErrInvalid", i, errs[i])
		}
	}
	if errs[2] != nil {
		t.Errorf("RenewBatch of the valid lease: got %v, want nil", errs[2])
	}
	if d := c.PTTL(ctx, "rbi:{k}").Val(); d <= 50*time.Second {
		t.Errorf("PTTL of the lease after RenewBatch: got %v, want about 1m", d)
	}
	if n := c.Exists(ctx, "rbi:{a{b}").Val(); n != 0 {
		t.Errorf("EXISTS of the invalid key's name: got %d, want 0", n)
	}

	hbs := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: "a}b", ID: "x", TTL: time.Minute}, {Key: "k", ID: "x", TTL: time.Minute}})
	if !errors.Is(hbs[0], backend.ErrInvalid) || hbs[1] != nil {
		t.Errorf("HeartbeatBatch: got %v, want ErrInvalid for the key with a brace, nil for the other", hbs)
	}
	if keys := c.Keys(ctx, "rbi:{a}*").Val(); len(keys) != 0 {
		t.Errorf("keys written for the key with a brace: got %q, want none", keys)
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for i, err := range b.RenewBatch(ctx, []backend.Lease{l, l}) {
		if !errors.Is(err, backend.ErrClosed) {
			t.Errorf("RenewBatch after Close, lease %d: got %v, want ErrClosed", i, err)
		}
	}
	for i, err := range b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: "k", ID: "y", TTL: time.Minute}}) {
		if !errors.Is(err, backend.ErrClosed) {
			t.Errorf("HeartbeatBatch after Close, heartbeat %d: got %v, want ErrClosed", i, err)
		}
	}
	if n := c.Exists(ctx, "rbi:{k}:heartbeat:y").Val(); n != 0 {
		t.Errorf("heartbeat record written after Close: EXISTS got %d, want 0", n)
	}
}
