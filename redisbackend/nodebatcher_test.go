package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// pipedScripts counts, on a Cluster client, the script calls made alone and
// those sent in pipelines, with the largest pipeline; entered, when set,
// receives the first key of every script call as it starts.
type pipedScripts struct {
	mu       sync.Mutex
	alone    int
	piped    int
	largest  int
	entered  chan string
	watching func(key string) bool
}

func (h *pipedScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func isScript(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval"
}

func firstKey(cmd redis.Cmder) string {
	if a := cmd.Args(); len(a) > 3 {
		if k, ok := a[3].(string); ok {
			return k
		}
	}
	return ""
}

func (h *pipedScripts) enter(cmd redis.Cmder) {
	h.mu.Lock()
	entered, watching := h.entered, h.watching
	h.mu.Unlock()
	if entered != nil && watching(firstKey(cmd)) {
		select {
		case entered <- firstKey(cmd):
		default:
		}
	}
}

func (h *pipedScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.mu.Lock()
			h.alone++
			h.mu.Unlock()
			h.enter(cmd)
		}
		return next(ctx, cmd)
	}
}

func (h *pipedScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if isScript(c) {
				n++
				h.enter(c)
			}
		}
		h.mu.Lock()
		h.piped += n
		h.largest = max(h.largest, n)
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// keysOn returns n election keys whose leases the master at addr serves.
func keysOn(t *testing.T, ctx context.Context, c *testredis.Cluster, prefix, addr string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("k%d", i)
		m, _, err := c.Shard(ctx, addr, slotOf(t, ctx, c, prefix, k))
		if err != nil {
			t.Fatal(err)
		}
		if m == addr {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestClusterCallsPipelineByMaster: on a Cluster, calls made at once share
// a pipeline (one a master), and a master that does not answer holds up
// only the calls of its own keys: those of the other master go on.
func TestClusterCallsPipelineByMaster(t *testing.T) {
	const prefix = "nb:"
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 2})
	ctx := ctxBound(t)
	cc := clusterClient(t, c)
	h := &pipedScripts{}
	cc.AddHook(h)
	b := newBackend(t, cc, &redisbackend.Options{Prefix: prefix})
	a0, a1 := c.Addrs()[0], c.Addrs()[1]

	// 1. Calls made at once share round trips.
	const goroutines, pairs = 64, 4
	var wg sync.WaitGroup
	errs := make([]error, goroutines)
	for i := range goroutines {
		wg.Go(func() {
			for j := range pairs {
				l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("share-%d-%d", i, j), HolderID: "h", TTL: time.Minute})
				if err == nil {
					err = b.Release(ctx, l)
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	alone, piped, largest := h.alone, h.piped, h.largest
	h.mu.Unlock()
	t.Logf("%d script calls from %d goroutines at once: %d alone, %d in pipelines, the largest of %d", 2*goroutines*pairs, goroutines, alone, piped, largest)
	if largest < 2 {
		t.Errorf("%d goroutines calling at once: no pipeline held more than %d script call; want calls to share round trips", goroutines, largest)
	}

	// 2. A frozen master holds up only its own keys' calls.
	onA := keysOn(t, ctx, c, prefix, a0, 4)
	onB := keysOn(t, ctx, c, prefix, a1, 10)
	stuck := map[string]bool{}
	for _, k := range onA {
		stuck[prefix+"{"+k+"}"] = true
	}
	h.mu.Lock()
	h.entered = make(chan string, len(onA))
	h.watching = func(key string) bool { return stuck[key] }
	h.mu.Unlock()
	frozen := c.Node(a0)
	frozen.Pause(t)
	defer frozen.Resume(t)
	const hang = 3 * time.Second
	var hung sync.WaitGroup
	for _, k := range onA {
		hung.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, hang)
			defer cancel()
			_, _ = b.Acquire(cctx, backend.AcquireRequest{Key: k, HolderID: "h", TTL: time.Minute})
		})
	}
	// Wait until the frozen master's calls are on their way: the first
	// alone, the others queued behind it and sent in a pipeline.
	for range 2 {
		select {
		case <-h.entered:
		case <-ctx.Done():
			t.Fatal("the calls to the frozen master never went out")
		}
	}
	start := time.Now()
	for _, k := range onB {
		cctx, cancel := context.WithTimeout(ctx, hang/2)
		l, err := b.Acquire(cctx, backend.AcquireRequest{Key: k, HolderID: "h", TTL: time.Minute})
		if err == nil {
			err = b.Release(cctx, l)
		}
		cancel()
		if err != nil {
			t.Fatalf("key %s on the master that answers, while %s is frozen with calls in flight: %v after %v; want it served",
				k, a0, err, time.Since(start))
		}
	}
	t.Logf("%d pairs on %s while %s was frozen: %v", len(onB), a1, a0, time.Since(start))
	frozen.Resume(t)
	hung.Wait()
}
