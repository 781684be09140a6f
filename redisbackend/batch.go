package redisbackend

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher pipelines script calls made concurrently by many goroutines.
//
// A call made while no other is in flight goes out at once on its own, so a
// single goroutine pays nothing. A call made while another is in flight is
// queued; one flusher goroutine (started when the queue fills, gone when it
// empties) sends everything queued as one pipeline, so that sixteen
// goroutines acquiring and releasing locks cost the server one read and one
// write per batch rather than per call. Each call is still its own atomic
// script; a pipeline only shares the round trip.
//
// A caller whose context ends while its call is queued or in a pipeline
// returns at once with the context's error, and the call's result is
// discarded, exactly as when a lone call's context ends mid-flight (see
// Backend.bounded): an Acquire abandoned this way may leave a lease that
// expires at its TTL.
type batcher struct {
	client Client
	max    int // calls per pipeline

	mu       sync.Mutex
	inFlight int // lone calls on the wire
	queue    []*batchCall
	flushing bool
}

type batchCall struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	done   chan struct{}
	v      any
	err    error
}

// do runs s with keys and args, alone or in a pipeline with calls made at
// the same time.
func (bt *batcher) do(ctx context.Context, s *redis.Script, keys []string, args []any) (any, error) {
	bt.mu.Lock()
	if bt.inFlight == 0 && len(bt.queue) == 0 {
		bt.inFlight++
		bt.mu.Unlock()
		v, err := s.Run(ctx, bt.client, keys, args...).Result()
		bt.mu.Lock()
		bt.inFlight--
		bt.mu.Unlock()
		return v, err
	}
	c := &batchCall{ctx: ctx, script: s, keys: keys, args: args, done: make(chan struct{})}
	bt.queue = append(bt.queue, c)
	if !bt.flushing {
		bt.flushing = true
		go bt.flush()
	}
	bt.mu.Unlock()
	select {
	case <-c.done:
		return c.v, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// flush sends the queue as pipelines until it is empty.
func (bt *batcher) flush() {
	for {
		bt.mu.Lock()
		n := min(len(bt.queue), bt.max)
		if n == 0 {
			bt.flushing = false
			bt.mu.Unlock()
			return
		}
		batch := bt.queue[:n:n]
		bt.queue = bt.queue[n:]
		if len(bt.queue) == 0 {
			bt.queue = nil
		}
		bt.mu.Unlock()
		bt.send(batch)
	}
}

// send runs the calls of batch whose context has not ended as one
// pipeline (evalPipeline).
func (bt *batcher) send(batch []*batchCall) {
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(live)
	defer cancel()
	scripts := make([]scriptCall, len(live))
	for i, c := range live {
		scripts[i] = scriptCall{script: c.script, keys: c.keys, args: c.args}
	}
	for i, cmd := range evalPipeline(ctx, bt.client, scripts) {
		live[i].v, live[i].err = cmd.Result()
	}
	for _, c := range live {
		close(c.done)
	}
}

// scriptCall is one script to run with its keys and arguments.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
}

// evalPipeline runs calls as one pipeline of EVALSHA, then, in a second
// pipeline, EVAL for each call whose script the server did not know
// (NOSCRIPT: after SCRIPT FLUSH or a restart). It returns each call's
// command, in order.
func evalPipeline(ctx context.Context, c Client, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	p := c.Pipeline()
	for i, sc := range calls {
		cmds[i] = sc.script.EvalSha(ctx, p, sc.keys, sc.args...)
	}
	_, _ = p.Exec(ctx)
	var retry []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		p := c.Pipeline()
		for _, i := range retry {
			cmds[i] = calls[i].script.Eval(ctx, p, calls[i].keys, calls[i].args...)
		}
		_, _ = p.Exec(ctx)
	}
	return cmds
}

// batchContext bounds a pipeline by the latest deadline of its calls (none
// when any call has none): one caller's short deadline must not fail the
// others, and each caller returns at its own deadline anyway.
func batchContext(calls []*batchCall) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
