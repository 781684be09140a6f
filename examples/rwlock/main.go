// Command rwlock shows shared locks, semaphores and lock hierarchies
// (package lock with AcquireOptions.Mode, Limit and Hierarchical) on the
// in-memory backend, so no server is needed. It prints what happens in
// three scenes:
//
//  1. Schema read/write: readers share the lock "schema/orders" in a
//     steady, overlapping stream, so the key is never free; a migration
//     takes it exclusively. Once it waits, new readers are refused (writer
//     preference), so the readers in place finish, the migration runs, and
//     the readers carry on after it.
//
//  2. A semaphore: at most 3 extractions per tenant at once; 7 arrive, and
//     with Fair the waiting ones get permits in the order they arrived.
//
//  3. A hierarchy: page locks under a file set, taken Hierarchical, run
//     side by side; an exclusive lock on the whole file set waits for every
//     page lock below it, and a page lock then waits for the file set.
//
//     go run ./examples/rwlock
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func main() {
	unit := flag.Duration("unit", 100*time.Millisecond, "the time unit every step is a multiple of")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *unit); err != nil {
		fmt.Fprintln(os.Stderr, "rwlock:", err)
		os.Exit(1)
	}
}

// demo is one run: a store, its Lockers, and a printer.
type demo struct {
	store *memorybackend.Store
	unit  time.Duration
	start time.Time
	out   io.Writer

	mu      sync.Mutex // guards out and lockers
	lockers []*lock.Locker
}

func (d *demo) say(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	el := time.Since(d.start) / d.unit
	fmt.Fprintf(d.out, "[%3d] "+format+"\n", append([]any{int(el)}, args...)...)
}

// locker returns a Locker for one process, closed by close.
func (d *demo) locker(id string) (*lock.Locker, error) {
	l, err := lock.New(d.store.Client(), id, &lock.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.lockers = append(d.lockers, l)
	d.mu.Unlock()
	return l, nil
}

func (d *demo) close() {
	d.mu.Lock()
	ls := d.lockers
	d.lockers = nil
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
}

// sleep waits n units or until ctx ends.
func (d *demo) sleep(ctx context.Context, n float64) error {
	t := time.NewTimer(time.Duration(n * float64(d.unit)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// run plays the three scenes; time stamps in brackets count units.
func run(ctx context.Context, out io.Writer, unit time.Duration) error {
	d := &demo{store: memorybackend.NewStore(), unit: unit, out: out}
	defer d.close()
	for _, scene := range []struct {
		title string
		play  func(context.Context, *demo) error
	}{
		{"schema read/write: readers share, the migration waits and is not starved", schema},
		{"semaphore: at most 3 extractions per tenant, served in order", semaphore},
		{"hierarchy: page locks under a file set", hierarchy},
	} {
		fmt.Fprintf(out, "== %s (time in units of %v)\n", scene.title, unit)
		d.start = time.Now()
		if err := scene.play(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// schema runs three readers in an overlapping stream and a migration that
// arrives while they read.
func schema(ctx context.Context, d *demo) error {
	const key = "schema/orders"
	read := &lock.AcquireOptions{Mode: lock.Shared}
	rctx, stopReaders := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		errs = make(chan error, 4)
	)
	for i := range 3 {
		r, err := d.locker(fmt.Sprintf("reader-%d", i+1))
		if err != nil {
			stopReaders()
			return err
		}
		wg.Go(func() {
			if d.sleep(rctx, float64(i)) != nil {
				return
			}
			for rctx.Err() == nil {
				err := r.Do(rctx, key, read, func(ctx context.Context, l *lock.Lock) error {
					d.say("%s reads the schema (term %d)", r.ID(), l.Term())
					return d.sleep(ctx, 3)
				})
				if err != nil && rctx.Err() == nil {
					errs <- fmt.Errorf("%s: %w", r.ID(), err)
					return
				}
			}
		})
	}
	m, err := d.locker("migrator")
	if err != nil {
		stopReaders()
		return err
	}
	if err := d.sleep(ctx, 5.5); err != nil {
		stopReaders()
		return err
	}
	d.say("migrator wants the schema exclusively; readers hold it")
	err = m.Do(ctx, key, nil, func(ctx context.Context, l *lock.Lock) error {
		d.say("migrator migrates (term %d): no reader holds it, none may enter", l.Term())
		probe, err := d.locker("late-reader")
		if err != nil {
			return err
		}
		_, err = probe.TryAcquire(ctx, key, read)
		var held *lock.HeldError
		if errors.As(err, &held) {
			d.say("late-reader refused: %v", err)
		}
		if err := d.sleep(ctx, 2); err != nil {
			return err
		}
		d.say("migration done; readers go on") // still under the lock: printed first
		return nil
	})
	if err != nil {
		stopReaders()
		return fmt.Errorf("migration: %w", err)
	}
	err = d.sleep(ctx, 4)
	stopReaders()
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	return err
}

// semaphore queues 7 extractions of one tenant behind 3 permits.
func semaphore(ctx context.Context, d *demo) error {
	key := lock.Key("extraction", "tenant-1")
	// Fair: the queued extractions get permits in the order they asked.
	permit := &lock.AcquireOptions{Mode: lock.Shared, Limit: 3, Fair: true}
	var (
		wg      sync.WaitGroup
		running atomic.Int32
		peak    atomic.Int32
		errs    = make(chan error, 7)
	)
	for i := range 7 {
		w, err := d.locker(fmt.Sprintf("extractor-%d", i+1))
		if err != nil {
			return err
		}
		wg.Go(func() {
			err := w.Do(ctx, key, permit, func(ctx context.Context, l *lock.Lock) error {
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				d.say("%s extracts (%d running)", w.ID(), n)
				err := d.sleep(ctx, 2)
				running.Add(-1)
				return err
			})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", w.ID(), err)
			}
		})
		if err := d.sleep(ctx, 0.1); err != nil { // arrive in order
			return err
		}
	}
	probe, err := d.locker("dashboard")
	if err != nil {
		return err
	}
	if hs, err := probe.Holders(ctx, key); err == nil {
		d.say("dashboard: %d of %d permits in use", len(hs), permit.Limit)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	d.say("all 7 extractions done, at most %d at once", peak.Load())
	return err
}

// hierarchy locks pages of a file set, then the whole set, then a page.
func hierarchy(ctx context.Context, d *demo) error {
	page := &lock.AcquireOptions{Hierarchical: true}
	a, err := d.locker("editor-a")
	if err != nil {
		return err
	}
	b, err := d.locker("editor-b")
	if err != nil {
		return err
	}
	c, err := d.locker("consolidator")
	if err != nil {
		return err
	}
	p1, err := a.TryAcquire(ctx, "fileset/42/page/1", page)
	if err != nil {
		return err
	}
	d.say("editor-a locks page 1 of file set 42")
	p2, err := b.TryAcquire(ctx, "fileset/42/page/2", page)
	if err != nil {
		return err
	}
	d.say("editor-b locks page 2 beside it: pages do not conflict")

	_, err = c.TryAcquire(ctx, "fileset/42", page)
	var held *lock.HeldError
	if !errors.As(err, &held) {
		return fmt.Errorf("the file-set lock over two page locks: got %v, want it held", err)
	}
	d.say("consolidator cannot lock file set 42: %d page locks below it (%s, %s)",
		len(held.Holders), held.Holders[0].Key, held.Holders[1].Key)

	set := make(chan *lock.Lock, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, "fileset/42", page)
		if err != nil {
			errc <- err
			return
		}
		d.say("consolidator locks file set 42 (term %d)", l.Term())
		set <- l
	}()
	if err := d.sleep(ctx, 1); err != nil {
		return err
	}
	d.say("editor-a is done with page 1")
	p1.Release(ctx)
	if err := d.sleep(ctx, 1); err != nil {
		return err
	}
	d.say("editor-b is done with page 2")
	p2.Release(ctx)
	var fs *lock.Lock
	select {
	case fs = <-set:
	case err := <-errc:
		return err
	}

	_, err = a.TryAcquire(ctx, "fileset/42/page/3", page)
	if errors.As(err, &held) {
		d.say("editor-a cannot lock page 3 now: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := a.Acquire(ctx, "fileset/42/page/3", page)
		if err == nil {
			d.say("editor-a locks page 3 (term %d)", l.Term())
			err = l.Release(ctx)
		}
		done <- err
	}()
	if err := d.sleep(ctx, 1); err != nil {
		return err
	}
	d.say("consolidator is done")
	if err := fs.Release(ctx); err != nil {
		return err
	}
	return <-done
}
