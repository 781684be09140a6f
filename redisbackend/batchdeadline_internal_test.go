package redisbackend

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/internal/testredis"
)

// TestBatchOutlivesShortDeadline: a pipeline of queued calls is bounded by
// the latest of their deadlines, so one caller's short deadline does not
// fail the others' calls: with the server paused for 500 ms, a call with a
// minute left, pipelined with one that has 100 ms left, gets its reply.
func TestBatchOutlivesShortDeadline(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
	admin := srv.NewClient(t, nil)
	ctx := context.Background()
	s := redis.NewScript("return ARGV[1]")
	if err := s.Load(ctx, c).Err(); err != nil { // also opens c's connection
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	long, cancelLong := context.WithTimeout(ctx, time.Minute)
	defer cancelLong()
	calls := []*batchCall{
		{ctx: short, script: s, args: []any{"short"}, done: make(chan struct{})},
		{ctx: long, script: s, args: []any{"long"}, done: make(chan struct{})},
	}
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	bt := &batcher{client: c, max: 64}
	bt.send(calls)
	if c := calls[1]; c.err != nil || c.v != "long" {
		t.Errorf("call with a minute left, pipelined with one of 100 ms, the server paused 500 ms: got %v, %v; want \"long\", nil", c.v, c.err)
	}
}

// pipelineSizes records the number of commands of each pipeline of
// scripts a client sends.
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (*pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "evalsha" { // not a new connection's handshake
			h.mu.Lock()
			h.sizes = append(h.sizes, len(cmds))
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// TestBatcherSplitsAtMax: the batcher sends its queue as pipelines of at
// most max calls (64 on a Backend), in order, and every call gets its own
// reply.
func TestBatcherSplitsAtMax(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := context.Background()
	s := redis.NewScript("return ARGV[1]")
	if err := s.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	hook := &pipelineSizes{}
	c.AddHook(hook)
	bt := &batcher{client: c, max: 2}
	var calls []*batchCall
	for i := range 5 {
		calls = append(calls, &batchCall{ctx: ctx, script: s, args: []any{strconv.Itoa(i)}, done: make(chan struct{})})
	}
	bt.queue, bt.flushing = calls, true // as do leaves them for the flusher
	bt.flush()
	if want := []int{2, 2, 1}; !slices.Equal(hook.sizes, want) {
		t.Errorf("pipelines sent for 5 queued calls, at most 2 a pipeline: got sizes %v, want %v", hook.sizes, want)
	}
	for i, c := range calls {
		if c.err != nil || c.v != strconv.Itoa(i) {
			t.Errorf("call %d: got %v, %v; want %q, nil", i, c.v, c.err, strconv.Itoa(i))
		}
	}
	if bt.flushing || len(bt.queue) != 0 {
		t.Errorf("after flush: flushing %v, %d queued; want false, 0", bt.flushing, len(bt.queue))
	}
}
