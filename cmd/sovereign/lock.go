package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
)

func cmdLock(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "lock", "lock [flags] KEY -- CMD [ARGS...]")
	var h holdFlags
	h.register(fs)
	try := fs.Bool("try", false, "one attempt: if the lock is held, say by whom and exit 75")
	waitFor := fs.Duration("wait", 0, "wait at most this long for the lock, then exit 75 (default: wait until stopped)")
	shared := fs.Bool("shared", false, "take a Shared lock: other --shared holders run at once (at most --limit), an exclusive holder does not")
	limit := fs.Int("limit", 0, "with --shared: at most `N` holders at once, a semaphore of N permits (0: no limit); every holder must give the same N")
	hier := fs.Bool("hierarchical", false, "treat / in KEY as levels: also take intent on each outer key, so that an exclusive lock on an outer key and this one exclude each other")
	fair := fs.Bool("fair", false, "wait in line: among the waiters of KEY, across processes, the first to wait is served first")
	minHold := fs.Duration("min-hold", 0, "keep the lock at least this long after taking it, however soon the command exits (a cron job run on every replica: a replica whose tick comes after the job finished skips it); sovereign exits then")
	key, argv, err := commandArgs(fs, args)
	if err != nil {
		return err
	}
	if *waitFor < 0 {
		return usageError("--wait must not be negative")
	}
	if *try && *waitFor > 0 {
		return usageError("--try and --wait exclude each other")
	}
	if *limit < 0 {
		return usageError("--limit must not be negative")
	}
	if *minHold < 0 {
		return usageError("--min-hold must not be negative")
	}
	if *limit > 0 && !*shared {
		return usageError("--limit is for --shared locks only")
	}
	log := h.logger(env)

	b, err := env.open()
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.ValidateKey(lockPrefix + key); err != nil {
		return exitWith(exitUsage, fmt.Errorf("lock key: %w", err))
	}
	locker, err := lock.New(b.Backend, h.id, &lock.Options{TTL: h.ttl, RenewDeadline: h.renewDeadline, Logger: log})
	if err != nil {
		return exitWith(exitUsage, err)
	}
	defer locker.Close()
	lo := locker.Options()
	hs, err := h.startHolding(ctx, env, b, lockPrefix+key, argv, lo.TTL, lo.RenewDeadline, log)
	if err != nil {
		return err
	}
	defer hs.close()
	waitCtx, sup := hs.ctx, &hs.sup

	ao := &lock.AcquireOptions{Metadata: h.meta(argv), Limit: *limit, Hierarchical: *hier, Fair: *fair, MinHold: *minHold}
	if *shared {
		ao.Mode = lock.Shared
	}
	var lk *lock.Lock
	switch {
	case *try:
		actx, cancel := context.WithTimeout(waitCtx, env.backend.commandTimeout)
		lk, err = locker.TryAcquire(actx, key, ao)
		cancel()
	case *waitFor > 0:
		actx, cancel := context.WithTimeout(waitCtx, *waitFor)
		lk, err = locker.Acquire(actx, key, ao)
		cancel()
	default:
		lk, err = locker.Acquire(waitCtx, key, ao)
	}
	if err != nil {
		if code, ok := sup.signalled(); ok {
			return exitWith(code, nil)
		}
		var held *lock.HeldError
		switch {
		case errors.As(err, &held):
			return exitWith(exitHeld, errors.New(describeHeld(held)))
		case errors.Is(err, lock.ErrUnsupported):
			return exitWith(exitUsage, fmt.Errorf("%w (the backend cannot serve --shared, --hierarchical or --fair)", err))
		case errors.Is(err, lock.ErrLimitMismatch):
			return exitWith(exitUsage, fmt.Errorf("%w: the live holders of %q took it with another --limit", err, key))
		}
		return unreachable(err)
	}
	release := func() {
		rctx, cancel := context.WithTimeout(context.Background(), lo.RequestTimeout)
		defer cancel()
		if err := lk.Release(rctx); err != nil && !errors.Is(err, lock.ErrLockLost) {
			log.Warn("sovereign: releasing the lock failed; it expires by its TTL", "key", key, "err", err)
		}
	}
	c, err := sup.start(hs.spec, childEnv(map[string]string{
		"SOVEREIGN_KEY":       key,
		"SOVEREIGN_HOLDER_ID": h.id,
		"SOVEREIGN_TERM":      strconv.FormatUint(lk.Term(), 10),
	}), lk.Deadline)
	if err != nil {
		release()
		if code, ok := sup.signalled(); ok {
			return exitWith(code, nil)
		}
		return err
	}
	log.Info("sovereign: lock held; command started", "key", key, "term", lk.Term(), "pid", c.pgid)
	out := supervise(lk.Context(), sup, c)
	release()
	if out.lost {
		log.Warn("sovereign: lock lost; command stopped", "key", key, "term", lk.Term(), "cause", out.cause, "status", out.status)
		return exitWith(exitLost, fmt.Errorf("%v; the command was stopped (%s)", out.cause, out.status))
	}
	if *minHold > 0 && lk.Err() == nil {
		// Release left the lock held until MinHold has passed: wait for its
		// release (or its loss), or a signal, which ends the wait early.
		log.Info("sovereign: command exited; keeping the lock for --min-hold", "key", key, "term", lk.Term(), "status", out.status, "min_hold", *minHold)
		select {
		case <-lk.Done():
		case <-waitCtx.Done():
		}
	}
	log.Info("sovereign: command exited; lock released", "key", key, "term", lk.Term(), "status", out.status)
	return exitWith(out.code, nil)
}

// describeHeld says who holds a lock: holder, term, since when, TTL left,
// metadata; for several holders (Shared holders, locks below a hierarchical
// key, an outer key's holder), one line for each, with its mode.
func describeHeld(e *lock.HeldError) string {
	var b strings.Builder
	r := e.Holder
	switch {
	case e.MayBeHeld:
		fmt.Fprintf(&b, "lock %q may be held: the store restarted less than a TTL ago and may have lost its holder's lease; it refuses the lock for %s more",
			e.Key, round(r.TTL))
	case len(e.Holders) == 0 && e.Waiting > 0 && r.Key != "" && r.Key != e.Key:
		fmt.Fprintf(&b, "lock %q has %d exclusive waiting ahead on lock %q (an exclusive lock waiting above keeps new --hierarchical locks below it out)", e.Key, e.Waiting, r.Key)
	case len(e.Holders) == 0 && e.Waiting > 0:
		fmt.Fprintf(&b, "lock %q has %d waiting ahead (an exclusive waiter keeps new shared holders out; --fair waiters go in order)", e.Key, e.Waiting)
	case len(e.Holders) <= 1 && r.Mode != backend.Shared && (r.Key == "" || r.Key == e.Key):
		fmt.Fprintf(&b, "lock %q is held by %q (term %d)", e.Key, r.HolderID, r.Term)
		if !r.AcquiredAt.IsZero() {
			fmt.Fprintf(&b, " since %s (%s ago)", r.AcquiredAt.Format(time.RFC3339), round(time.Since(r.AcquiredAt)))
		}
		if r.TTL > 0 {
			fmt.Fprintf(&b, ", lease %s left", round(r.TTL))
		}
		if md := formatMetadata(r.Metadata); md != "" {
			fmt.Fprintf(&b, "; metadata %s", md)
		}
		if e.Waiting > 0 {
			fmt.Fprintf(&b, "; %d waiting ahead", e.Waiting)
		}
	default:
		recs := e.Holders
		if len(recs) == 0 {
			recs = []backend.Record{r}
		}
		n := len(recs)
		fmt.Fprintf(&b, "lock %q is held by %d holder", e.Key, n)
		if n > 1 {
			b.WriteString("s")
		}
		if e.Waiting > 0 {
			fmt.Fprintf(&b, ", %d waiting ahead", e.Waiting)
		}
		b.WriteString(":")
		now := time.Now()
		for _, rec := range recs {
			h := newHolder(rec)
			b.WriteString("\n  ")
			if rec.Key != "" && rec.Key != e.Key {
				fmt.Fprintf(&b, "lock %q: ", rec.Key)
			}
			b.WriteString(describeHolder(h, now))
		}
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " (gave up waiting: %v)", e.Err)
	}
	return b.String()
}
