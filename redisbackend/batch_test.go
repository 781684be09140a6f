package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// pipelineCounter counts the pipelines a client sends and the largest.
type pipelineCounter struct {
	pipelines atomic.Int64
	largest   atomic.Int64
}

func (*pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.pipelines.Add(1)
		for {
			l := p.largest.Load()
			if int64(len(cmds)) <= l || p.largest.CompareAndSwap(l, int64(len(cmds))) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestConcurrentCallsShareRoundTrips: calls made while another is in flight
// go out together as one pipeline, each still its own atomic script with
// its own result, on a real server.
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	srv := testredis.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var pc pipelineCounter
	c.AddHook(&pc)
	b := newBackend(t, c, nil)
	ctx := context.Background()

	const goroutines, rounds = 32, 50
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("lock/batch-%d", g)
			var last uint64
			for range rounds {
				l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "me", TTL: 10 * time.Second})
				if err != nil {
					errs <- fmt.Errorf("%s: acquire: %w", key, err)
					return
				}
				if l.Term <= last {
					errs <- fmt.Errorf("%s: term %d after %d", key, l.Term, last)
					return
				}
				last = l.Term
				// Another goroutine's key is never handed out twice: a
				// second acquisition of this one must fail with its record.
				var held *backend.HeldError
				if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "other", TTL: time.Second}); !errors.As(err, &held) || held.Holder.Token != l.Token {
					errs <- fmt.Errorf("%s: second acquire: got %v, want HeldError naming token %s", key, err, l.Token)
					return
				}
				if err := b.Release(ctx, l); err != nil {
					errs <- fmt.Errorf("%s: release: %w", key, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if pc.pipelines.Load() == 0 || pc.largest.Load() < 2 {
		t.Errorf("%d pipelines, the largest of %d calls: concurrent calls were not batched", pc.pipelines.Load(), pc.largest.Load())
	}
	t.Logf("%d pipelines, the largest of %d calls", pc.pipelines.Load(), pc.largest.Load())
}

// TestBatchedCallsSurviveScriptFlush: a pipeline whose scripts the server
// forgot (SCRIPT FLUSH, a restart) is sent again with EVAL for those calls.
func TestBatchedCallsSurviveScriptFlush(t *testing.T) {
	srv := testredis.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, nil)
	ctx := context.Background()
	for round := range 5 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("lock/flush-%d-%d", round, g), HolderID: "me", TTL: 10 * time.Second})
				if err == nil {
					err = b.Release(ctx, l)
				}
				if err != nil {
					failed.Add(1)
					t.Errorf("after SCRIPT FLUSH: %v", err)
				}
			}()
		}
		wg.Wait()
	}
}

// TestQueuedCallReturnsAtItsDeadline: a call queued behind one that hangs
// returns at its own context's end, while the store hangs.
func TestQueuedCallReturnsAtItsDeadline(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Args: []string{"--enable-debug-command", "yes"}})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, nil)
	// Block the server for a while with a client of its own, so the first
	// call is in flight while the second queues behind it.
	blocker := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = blocker.Close() })
	hung := make(chan error, 1)
	go func() { hung <- blocker.Do(context.Background(), "DEBUG", "SLEEP", "3").Err() }()
	// Wait until the server is busy: a PING with a short deadline times out.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never got busy: DEBUG SLEEP: %v", <-hung)
		}
	}
	done := make(chan error, 2)
	for i := range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("lock/hang-%d", i), HolderID: "me", TTL: 10 * time.Second})
			done <- err
		}()
	}
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("got %v, want an error matching context.DeadlineExceeded", err)
			}
		case <-time.After(2500 * time.Millisecond):
			t.Fatal("a call did not return at its deadline while the server hung")
		}
	}
	if err := <-hung; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
}
