// Command workerlease shows why a lock is not enough on its own, and how
// fencing terms close the gap. Tasks are leased to workers with a lock per
// task. Worker 1 leases task-1 and then pauses (a long GC pause, SIGSTOP, a
// suspended VM) for longer than the lock's TTL; the lock expires and worker 2
// leases the task with a higher fencing term and finishes it. When worker 1
// resumes it still believes in its decision and writes its result late; the
// task store rejects that write because it carries a fencing term lower than
// the one it has already seen. It runs on the in-memory backend, so no
// server is needed.
//
//	go run ./examples/workerlease
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func main() {
	ttl := flag.Duration("ttl", time.Second, "lock TTL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "workerlease:", err)
		os.Exit(1)
	}
}

// ErrStaleTerm is returned by the task store for a write whose fencing term
// is lower than the task's.
var ErrStaleTerm = errors.New("stale fencing term")

// taskStore stands for the database the workers write their results to. In
// SQL, the check is part of the write:
//
//	UPDATE tasks
//	   SET status = $status, worker = $worker, fencing_term = $term
//	 WHERE id = $id AND fencing_term <= $term
//
// and zero rows updated means the writer's lock is stale. In Redis, the
// same check as one script (KEYS[1] the task hash; ARGV: term, status,
// worker), atomic on the server:
//
//	local cur = redis.call('HGET', KEYS[1], 'fencing_term') or '0'
//	if tonumber(ARGV[1]) < tonumber(cur) then
//	  return redis.error_reply('STALE fencing term ' .. ARGV[1] .. ' < ' .. cur)
//	end
//	redis.call('HSET', KEYS[1], 'fencing_term', ARGV[1], 'status', ARGV[2], 'worker', ARGV[3])
//	return 'OK'
//
// (Redis terms are about 1.7e15, below 2^53, so Lua's numbers hold them
// exactly; but Lua prints such a number as 1.7955207934115e+15, so keep
// and print the stored string, never tostring(tonumber(...)).) Update does
// the same in Go.
type taskStore struct {
	mu    sync.Mutex // guards tasks
	tasks map[string]task
}

type task struct {
	status, worker string
	fencingTerm    uint64
}

// Update applies the write if term is not lower than the task's fencing term.
func (s *taskStore) Update(id, worker string, term uint64, status string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[id]
	if term < t.fencingTerm { // WHERE fencing_term <= $term matched no row
		return fmt.Errorf("%w: %s wrote %q to %s with term %d, the task is at term %d",
			ErrStaleTerm, worker, status, id, term, t.fencingTerm)
	}
	s.tasks[id] = task{status: status, worker: worker, fencingTerm: term}
	return nil
}

func (s *taskStore) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.tasks))
	for id := range s.tasks {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := ""
	for _, id := range ids {
		t := s.tasks[id]
		out += fmt.Sprintf("  %-7s %-8s by %-8s fencing_term %d\n", id, t.status, t.worker, t.fencingTerm)
	}
	return out
}

func run(ctx context.Context, out io.Writer, ttl time.Duration) error {
	start := time.Now()
	var mu sync.Mutex // serialises printing
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%6.3fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	store := memorybackend.NewStore() // the lock backend
	db := &taskStore{tasks: map[string]task{"task-1": {status: "queued"}, "task-2": {status: "queued"}}}
	newWorker := func(id string) (*lock.Locker, *memorybackend.Backend, error) {
		b := store.Client()
		l, err := lock.New(b, id, &lock.Options{TTL: ttl, Logger: slog.New(slog.DiscardHandler)})
		return l, b, err
	}
	w1, b1, err := newWorker("worker-1")
	if err != nil {
		return err
	}
	defer b1.Close()
	defer w1.Close()
	w2, b2, err := newWorker("worker-2")
	if err != nil {
		return err
	}
	defer b2.Close()
	defer w2.Close()

	// Worker 1 leases task-1 and starts it.
	l1, err := w1.TryAcquire(ctx, "tasks/task-1", nil)
	if err != nil {
		return err
	}
	term1 := l1.Term()
	say("worker-1 leased task-1 (fencing term %d)", term1)
	if err := db.Update("task-1", "worker-1", term1, "running"); err != nil {
		return err
	}
	say("worker-1 wrote task-1 = running (term %d): accepted", term1)

	// Worker 2 wants task-1 too, and takes task-2 meanwhile.
	w2wrote := make(chan error, 1)
	go func() {
		l2, err := w2.Acquire(ctx, "tasks/task-1", nil) // waits for worker 1's lock
		if err != nil {
			w2wrote <- err
			return
		}
		defer l2.Release(context.WithoutCancel(ctx))
		say("worker-2 leased task-1 (fencing term %d): worker-1's lock expired", l2.Term())
		err = db.Update("task-1", "worker-2", l2.Term(), "done")
		if err == nil {
			say("worker-2 wrote task-1 = done (term %d): accepted", l2.Term())
		}
		w2wrote <- err
	}()
	if err := w2.TryDo(ctx, "tasks/task-2", nil, func(ctx context.Context, l *lock.Lock) error {
		say("worker-2 leased task-2 (fencing term %d)", l.Term())
		if err := db.Update("task-2", "worker-2", l.Term(), "done"); err != nil {
			return err
		}
		say("worker-2 wrote task-2 = done (term %d): accepted", l.Term())
		return nil
	}); err != nil {
		return err
	}

	// Worker 1 pauses: no goroutine of its process runs, so it renews
	// nothing (its connection is cut here to stand for that) and it cannot
	// look at its lock's context either.
	say("worker-1 pauses (GC pause, SIGSTOP) with task-1's result ready to write")
	b1.Partition()
	pausedAt := time.Now()
	if err := <-w2wrote; err != nil {
		return err
	}
	b1.Heal()
	say("worker-1 resumes after %v and writes its late result", time.Since(pausedAt).Round(time.Millisecond))

	// The late write carries term 1 and is rejected.
	if err := db.Update("task-1", "worker-1", term1, "done"); errors.Is(err, ErrStaleTerm) {
		say("task store rejected it: %v", err)
	} else {
		return fmt.Errorf("the stale write was not rejected: %v", err)
	}
	// Had worker 1 looked, its lock would have told it the same.
	say("worker-1's lock: held %v, %v", l1.Held(), l1.Err())
	say("worker-1 releases: %v", l1.Release(ctx))
	fmt.Fprintf(out, "tasks:\n%s", db)
	return nil
}
