package redisbackend_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// scriptKeysHook records the number of keys of every script call a client
// sends, pipelined or not.
type scriptKeysHook struct {
	mu   sync.Mutex
	keys []int
}

func (*scriptKeysHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptKeysHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}
func (h *scriptKeysHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.record(cmd)
		}
		return next(ctx, cmds)
	}
}
func (h *scriptKeysHook) record(cmd redis.Cmder) {
	if name := cmd.Name(); name != "evalsha" && name != "eval" {
		return
	}
	n, _ := strconv.Atoi(fmt.Sprint(cmd.Args()[2]))
	h.mu.Lock()
	h.keys = append(h.keys, n)
	h.mu.Unlock()
}
func (h *scriptKeysHook) take() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.keys
	h.keys = nil
	return k
}

// TestBatchSplitsAtLimit: a batch of one item more than two scripts' worth
// (256 items a script) is sent as three scripts of 256, 256 and 1 items,
// and every item of every part is served.
func TestBatchSplitsAtLimit(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "bl:"})
	const n = 2*256 + 1
	leases := make([]backend.Lease, n)
	for i := range leases {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("b-%d", i), HolderID: "me", TTL: 10 * time.Second})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		l.TTL = time.Minute // renewed by more than acquired, to see it
		leases[i] = l
	}
	// Load both scripts first, so that the calls counted are the batches'.
	if errs := b.RenewBatch(ctx, leases[:1]); errs[0] != nil {
		t.Fatalf("RenewBatch: %v", errs[0])
	}
	if errs := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: "warm-up", ID: "me", TTL: time.Second}}); errs[0] != nil {
		t.Fatalf("HeartbeatBatch: %v", errs[0])
	}
	hook := &scriptKeysHook{}
	c.AddHook(hook)
	// pttls returns the PTTL of each name, in one pipeline.
	pttls := func(names func(i int) string) []time.Duration {
		t.Helper()
		p := c.Pipeline()
		cmds := make([]*redis.DurationCmd, n)
		for i := range cmds {
			cmds[i] = p.PTTL(ctx, names(i))
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatalf("PTTL pipeline: %v", err)
		}
		out := make([]time.Duration, n)
		for i, cmd := range cmds {
			out[i] = cmd.Val()
		}
		return out
	}

	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Errorf("RenewBatch, lease %d: got %v, want nil", i, err)
		}
	}
	if got, want := hook.take(), []int{256, 256, 1}; !slices.Equal(got, want) {
		t.Errorf("keys of the RenewBatch scripts: got %v, want %v (one key a lease)", got, want)
	}
	for i, d := range pttls(func(i int) string { return fmt.Sprintf("bl:{b-%d}", i) }) {
		if d <= 50*time.Second {
			t.Errorf("PTTL of lease %d after RenewBatch: got %v, want about 1m", i, d)
		}
	}

	reqs := make([]backend.HeartbeatRequest, n)
	for i := range reqs {
		reqs[i] = backend.HeartbeatRequest{Key: fmt.Sprintf("b-%d", i), ID: "me", TTL: time.Minute}
	}
	for i, err := range b.HeartbeatBatch(ctx, reqs) {
		if err != nil {
			t.Errorf("HeartbeatBatch, heartbeat %d: got %v, want nil", i, err)
		}
	}
	if got, want := hook.take(), []int{512, 512, 2}; !slices.Equal(got, want) {
		t.Errorf("keys of the HeartbeatBatch scripts: got %v, want %v (two keys a heartbeat)", got, want)
	}
	for i, d := range pttls(func(i int) string { return fmt.Sprintf("bl:{b-%d}:heartbeat:me", i) }) {
		if d <= 50*time.Second {
			t.Errorf("PTTL of heartbeat record %d after HeartbeatBatch: got %v, want about 1m", i, d)
		}
	}
}

// TestTTLRoundsUp: a TTL is sent in whole milliseconds, rounded up, never
// down (a TTL under a millisecond is one, not zero): the lease reports the
// TTL granted.
func TestTTLRoundsUp(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "tr:"})
	for i, tt := range []struct{ ttl, want time.Duration }{
		{time.Nanosecond, time.Millisecond},
		{time.Millisecond - 1, time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{time.Minute + 1, time.Minute + time.Millisecond},
	} {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("plain-%d", i), HolderID: "me", TTL: tt.ttl})
		if err != nil || l.TTL != tt.want {
			t.Errorf("Acquire with TTL %v: got TTL %v, %v; want %v, nil", tt.ttl, l.TTL, err, tt.want)
		}
		l, err = b.AcquireMode(ctx, modeReq(fmt.Sprintf("lock/entry-%d", i), "me", tt.ttl, backend.Shared))
		if err != nil || l.TTL != tt.want {
			t.Errorf("AcquireMode with TTL %v: got TTL %v, %v; want %v, nil", tt.ttl, l.TTL, err, tt.want)
		}
	}
}

// TestBatchesReturnAtDeadline: RenewBatch, HeartbeatBatch and List return by
// their context's deadline when the server hangs, even with a client that
// does not apply context deadlines to its socket (TestUnreachable covers
// the calls of one key).
func TestBatchesReturnAtDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	const slack = 700 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: silentServer(t), ContextTimeoutEnabled: false,
		ReadTimeout: 2 * time.Second, DialTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, nil)
	lease := backend.Lease{Key: "k", HolderID: "a", Token: "t", Term: 1, TTL: time.Second}
	for name, call := range map[string]func(ctx context.Context) error{
		"RenewBatch": func(ctx context.Context) error { return b.RenewBatch(ctx, []backend.Lease{lease})[0] },
		"HeartbeatBatch": func(ctx context.Context) error {
			return b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: "k", ID: "a", TTL: time.Second}})[0]
		},
		"List": func(ctx context.Context) error { _, err := b.List(ctx, ""); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		if err == nil {
			t.Errorf("%s: got nil error, want one", name)
		}
		if took > deadline+slack {
			t.Errorf("%s: returned after %v, want by the deadline %v (+%v)", name, took, deadline, slack)
		}
	}
}
