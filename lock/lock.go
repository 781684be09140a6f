package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
)

// Lock is a held lock, returned by TryAcquire and Acquire and passed to the
// functions of Do and TryDo. It is renewed in the background until Release;
// its context is cancelled the moment it is lost or released. Its methods
// are safe for concurrent use, from any goroutine.
type Lock struct {
	l   *Locker
	key string
	p   params // p.metadata is the metadata given at acquisition
	// hold is started before the Lock is shared; it keeps the lease, and
	// when its acquisition was sent (Hold.Acquired, monotonic clock).
	hold keeper.Hold

	mu          sync.Mutex        // guards the fields below
	md          map[string]string // the metadata last set
	cancelledAt time.Time         // when that function's context was cancelled; zero if not
	fnRunning   bool              // a Do/TryDo function holds the lock
	released    bool              // Release has begun
	// releaseDeferred: a Release before MinHold passed left the release to
	// a goroutine (deferRelease).
	releaseDeferred bool
}

func (lk *Lock) fnStarted() {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	lk.fnRunning = true
}

func (lk *Lock) fnCancelled() {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.fnRunning && lk.cancelledAt.IsZero() {
		lk.cancelledAt = time.Now()
	}
}

func (lk *Lock) fnDone() {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	lk.fnRunning = false
}

// start keeps lease, acquired by a request sent at sent, and registers the
// lock with the Locker; after Close it releases the lease and returns
// ErrClosed.
func (l *Locker) start(key string, lease backend.Lease, sent time.Time, p params) (*Lock, error) {
	// p.metadata is the caller's map cloned (params), never changed.
	lk := &Lock{l: l, key: key, p: p, md: p.metadata}
	var kb backend.Backend = l.b
	if lease.Entry != nil && lease.Entry.Mode == Shared {
		// The keeper's Verify reads the key's record; Get returns the
		// oldest holder, so a Shared lease reads its own among all.
		kb = entryView{Backend: l.b, modes: l.modes, token: lease.Token}
	}
	cfg := keeper.Config{
		Backend:        kb,
		TTL:            p.ttl,
		RenewDeadline:  p.renewDeadline,
		RenewInterval:  p.renewInterval,
		RequestTimeout: p.requestTimeout,
		NoRenew:        p.noRenew,
		MaxHold:        p.maxHold,
		Owner:          (*holdOwner)(lk),
		Bounds:         l.relBounds,
	}
	// The hold starts before l.mu is taken, so that concurrent calls do not
	// wait for each other's scheduler work. l.monitors counts the hold
	// until it has finished: adding to it here is safe, since start runs
	// within a call counted in l.ops, which Close waits for before it waits
	// for l.monitors.
	l.monitors.Add(1)
	keeper.StartIn(&lk.hold, l.holdCtx, cfg, lease, sent)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = lk.hold.Release(context.Background()) // owner-checked; counts the hold out of l.monitors
		return nil, fmt.Errorf("lock: acquire %q: %w", key, ErrClosed)
	}
	// A short lock starts no goroutine and sets no timer of its own but
	// its hold's (none on a backend that renews in batches): a loss is
	// reported by the hold's owner callback, and the Locker's one reset
	// watch starts only once a lock is still held a quarter of
	// RenewInterval after its acquisition (one Locker timer checks).
	l.locks[lk] = struct{}{}
	l.armWatchLocked(sent.Add(p.renewInterval / 4))
	l.mu.Unlock()
	return lk, nil
}

// holdOwner is a Lock as the owner of its hold (keeper.Owner), so that the
// hold's callbacks cost no closure and Lock's method set stays its own.
type holdOwner Lock

// Cause builds the context cause of a step-down.
func (o *holdOwner) Cause(r keeper.Reason, err error) error { return (*Lock)(o).cause(r, err) }

// SteppedDown reports a loss.
func (o *holdOwner) SteppedDown(r keeper.Reason) {
	if lostReason(r) {
		lk := (*Lock)(o)
		_, cause := lk.hold.Reason()
		lk.reportLost(r, cause)
	}
}

// Failed logs a failed renewal or release.
func (o *holdOwner) Failed(op string, err error) {
	o.l.log.Warn("lock: "+op+" failed", "key", o.key, "term", (*Lock)(o).Term(), "err", err)
}

// Finished counts the hold out of the Locker's monitors.
func (o *holdOwner) Finished() { o.l.monitors.Done() }

// armWatchLocked has watchTick run at at (or earlier), unless the reset
// watch runs or the backend cannot watch. l.mu must be held.
func (l *Locker) armWatchLocked(at time.Time) {
	switch {
	case l.watcher == nil || l.closed || l.stopResets != nil:
	case !l.watchArmed:
		l.watchArmed, l.watchAt = true, at
		l.monitors.Add(1) // done by watchTick, or by Close when it stops the timer
		if l.watchT == nil {
			l.watchT = time.AfterFunc(time.Until(at), l.watchTick)
		} else {
			l.watchT.Reset(time.Until(at))
		}
	case at.Before(l.watchAt) && l.watchT.Stop():
		l.watchAt = at
		l.watchT.Reset(time.Until(at))
	}
}

// watchTick is the Locker's watch timer's callback: it starts the reset
// watch when a lock has been held a quarter of its RenewInterval, or sets
// the timer for when the first one will have been.
func (l *Locker) watchTick() {
	defer l.monitors.Done()
	l.mu.Lock()
	l.watchArmed = false
	if l.closed || l.stopResets != nil {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	var next time.Time
	start := false
	for lk := range l.locks {
		at := lk.hold.Acquired().Add(lk.p.renewInterval / 4)
		if !now.Before(at) {
			start = true
			break
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if !start && !next.IsZero() {
		l.armWatchLocked(next)
	}
	l.mu.Unlock()
	if start {
		l.startResetWatch()
	}
}

// reportLost reports a lock lost for reason r.
func (lk *Lock) reportLost(r keeper.Reason, cause error) {
	l := lk.l
	l.opts.Metrics.Lost(l.opts.Class(lk.key), r.String())
	l.log.Info("lock: lost", "key", lk.key, "term", lk.Term(), "cause", cause)
}

// cause builds the context cause of a step-down.
func (lk *Lock) cause(r keeper.Reason, err error) error {
	switch r {
	case keeper.Deadline:
		return newKeyError(lk.key, "lost: no renewal succeeded before the renew deadline", err, ErrLockLost)
	case keeper.LeaseLost:
		return newKeyError(lk.key, "lost: the store no longer holds it", err, ErrLockLost)
	case keeper.MaxHold:
		return newKeyError(lk.key, fmt.Sprintf("lost: held for MaxHold (%v)", lk.p.maxHold), nil, ErrLockLost, ErrMaxHold)
	case keeper.Released:
		return newKeyError(lk.key, "released", nil, ErrReleased)
	}
	return newKeyError(lk.key, r.String(), err)
}

// lostReason reports whether a step-down of reason r means the lock was lost.
func lostReason(r keeper.Reason) bool {
	return r == keeper.Deadline || r == keeper.LeaseLost || r == keeper.MaxHold
}

// resetKey is the key the reset watch subscribes to. Nothing is stored
// under it: the subscription is there to learn when the store's connection
// broke or the store restarted, which every watch of a backend learns at
// once (its channel closes, or an EventReset arrives).
const resetKey = backend.LockKeyPrefix + ".sovereign/reset"

// startResetWatch starts the Locker's reset watch unless it runs: one
// subscription for every lock the Locker holds, however many, so that a
// store that restarted (and may have lost them) is noticed within a round
// trip: every held lock renews at once, and those the store lost step down.
// It is started by a lock still held a quarter of RenewInterval after its
// acquisition (short locks cost no subscription), and it ends when the
// Locker holds no lock any more.
func (l *Locker) startResetWatch() {
	if l.watcher == nil || l.b.ValidateKey(resetKey) != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.stopResets != nil || len(l.locks) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(l.closeCtx)
	l.stopResets = cancel
	l.monitors.Add(1)
	go func() {
		defer l.monitors.Done()
		l.watchResets(ctx)
	}()
}

// stopResetWatchLocked ends the reset watch when the Locker holds no lock.
// l.mu must be held.
func (l *Locker) stopResetWatchLocked() {
	if l.stopResets != nil && len(l.locks) == 0 {
		l.stopResets()
		l.stopResets = nil
	}
}

// watchResets renews every held lock at once whenever the reset watch
// reports anything or breaks, until ctx ends. It renews right after
// subscribing too, which covers the stretch before the subscription.
func (l *Locker) watchResets(ctx context.Context) {
	sub := l.subscribe(ctx, resetKey, l.opts.RequestTimeout, l.opts.RenewInterval)
	defer sub.stop()
	first := true
	for ctx.Err() == nil {
		sub.ensure()
		if sub.off {
			return
		}
		if sub.ch != nil && (sub.resubbed || first) {
			sub.resubbed, first = false, false
			l.renewAll() // changes may have been missed
		}
		var (
			retry <-chan time.Time
			t     *time.Timer
		)
		if sub.ch == nil {
			t = time.NewTimer(max(time.Until(sub.next), 0))
			retry = t.C
		}
		select {
		case <-ctx.Done():
		case <-retry:
		case _, ok := <-sub.ch:
			if !ok {
				sub.closed()
			}
			l.renewAll()
		}
		if t != nil {
			t.Stop()
		}
	}
}

// renewAll asks every held lock for a renewal at once.
func (l *Locker) renewAll() {
	l.mu.Lock()
	holds := make([]*keeper.Hold, 0, len(l.locks))
	for lk := range l.locks {
		holds = append(holds, &lk.hold)
	}
	l.mu.Unlock()
	for _, h := range holds {
		h.RenewNow()
	}
}

// Key returns the lock key.
func (lk *Lock) Key() string { return lk.key }

// Mode returns the mode the lock holds its key in.
func (lk *Lock) Mode() Mode { return lk.p.mode }

// entryView is the backend a Shared lock's keeper uses: Get returns the
// lock's own record among the key's holders (the oldest other holder when it
// is gone, so the keeper sees it is not this lease).
type entryView struct {
	backend.Backend
	modes backend.Modes
	token string
}

// Get returns the record of the holder with v's token.
func (v entryView) Get(ctx context.Context, key string) (backend.Record, error) {
	recs, err := v.modes.Holders(ctx, key)
	if err != nil {
		return backend.Record{}, err
	}
	for _, r := range recs {
		if r.Token == v.token {
			return r, nil
		}
	}
	if len(recs) == 0 {
		return backend.Record{}, fmt.Errorf("%w: %q", backend.ErrNotHeld, key)
	}
	return recs[0], nil
}

// Term returns the fencing term of this acquisition: strictly greater than
// every earlier term of the key. Pass it with every write to a downstream
// store and have the store refuse lower terms.
func (lk *Lock) Term() uint64 { return lk.hold.Lease().Term }

// Record returns the lock's record as this process knows it: holder, token,
// term, the TTL granted, when the acquisition was sent (by this process's
// clock; Locker.Holders reads the store's record, timed by the store's
// clock), and the metadata last set. Its key is the lock key.
func (lk *Lock) Record() backend.Record {
	lease := lk.hold.Lease()
	at := lk.hold.Acquired().Round(0)
	lk.mu.Lock()
	md := maps.Clone(lk.md)
	lk.mu.Unlock()
	return backend.Record{
		Key: lk.key, HolderID: lease.HolderID, Token: lease.Token, Term: lease.Term,
		AcquiredAt: at, RenewedAt: at, TTL: lease.TTL, Metadata: md,
		Mode: lk.p.mode, Limit: lk.p.limit,
	}
}

// Context returns a context that is cancelled when the lock is lost or no
// longer certain (cause matching ErrLockLost, and ErrMaxHold after MaxHold),
// released (cause matching ErrReleased) or stopped by Close (cause matching
// ErrClosed). Read the cause with context.Cause or Err. The context does not
// derive from the context given to TryAcquire or Acquire.
func (lk *Lock) Context() context.Context { return lk.hold.Context() }

// Done returns a channel that is closed when Context is cancelled.
func (lk *Lock) Done() <-chan struct{} { return lk.hold.Done() }

// Err returns nil while the lock's context is alive, and its cause after.
func (lk *Lock) Err() error {
	_, cause := lk.hold.Reason()
	return cause
}

// Held reports whether the lock is held now: not released, lost or stopped,
// and its renew deadline not passed. It does no I/O and checks the deadline
// against the monotonic clock on every call, so a process that was paused
// answers false as soon as it runs again. When it finds the deadline passed
// before the timer that cancels the lock's context has run, it cancels the
// context itself: once Held has answered false, Err and Context report the
// loss (cause matching ErrLockLost).
func (lk *Lock) Held() bool { return lk.hold.Held() }

// Deadline returns when the lock will be considered lost unless a renewal
// succeeds before then.
func (lk *Lock) Deadline() time.Time { return lk.hold.Deadline() }

// stepped returns the step-down's cause, or an error matching ErrLockLost
// when the deadline has passed, or nil while the lock is held.
func (lk *Lock) stepped() error {
	if r, cause := lk.hold.Reason(); r != 0 {
		return cause
	}
	if !lk.hold.Held() { // the deadline passed; its timer has not run yet
		return newKeyError(lk.key, "lost: no renewal succeeded before the renew deadline", nil, ErrLockLost)
	}
	return nil
}

// lostErr turns an error reporting the lease gone into one matching
// ErrLockLost.
func (lk *Lock) lostErr(op string, err error) error {
	if errors.Is(err, backend.ErrLeaseLost) && !errors.Is(err, ErrLockLost) {
		return newKeyError(lk.key, "lost: the store no longer holds it", err, ErrLockLost)
	}
	return fmt.Errorf("lock: %s %q: %w", op, lk.key, err)
}

// Verify reads the lock's record from the store and checks that it is this
// acquisition (holder, token and term): one round trip, for use right before
// an irreversible step. When the store no longer holds it, the lock is lost
// (its context is cancelled) and the error matches ErrLockLost. After the
// lock was released or lost, Verify returns that cause without I/O.
func (lk *Lock) Verify(ctx context.Context) error {
	if cause := lk.stepped(); cause != nil {
		return fmt.Errorf("lock: verify %q: %w", lk.key, cause)
	}
	if _, err := lk.hold.Verify(ctx); err != nil {
		if cause := lk.stepped(); cause != nil && !errors.Is(err, backend.ErrLeaseLost) {
			return fmt.Errorf("lock: verify %q: %w", lk.key, cause)
		}
		return lk.lostErr("verify", err)
	}
	return nil
}

// Extend renews the lock now, in the caller's goroutine, bounded by ctx,
// RequestTimeout and the lock's deadline; with AcquireOptions.NoRenew it is
// the only way to keep the lock past its first deadline. When the store no
// longer holds the lock, the lock is lost and the error matches ErrLockLost.
// After the lock was released or lost, Extend returns that cause.
func (lk *Lock) Extend(ctx context.Context) error {
	if cause := lk.stepped(); cause != nil {
		return fmt.Errorf("lock: extend %q: %w", lk.key, cause)
	}
	if err := lk.hold.Extend(ctx); err != nil {
		return lk.lostErr("extend", err)
	}
	if cause := lk.stepped(); cause != nil { // a late success does not revive it
		return fmt.Errorf("lock: extend %q: %w", lk.key, cause)
	}
	return nil
}

// SetMetadata replaces the metadata stored with the lock (owner-checked; it
// does not extend the lock). When the store no longer holds the lock, the
// lock is lost and the error matches ErrLockLost.
func (lk *Lock) SetMetadata(ctx context.Context, md map[string]string) error {
	if cause := lk.stepped(); cause != nil {
		return fmt.Errorf("lock: set metadata %q: %w", lk.key, cause)
	}
	if err := lk.hold.SetMetadata(ctx, md); err != nil {
		return lk.lostErr("set metadata", err)
	}
	lk.mu.Lock()
	lk.md = maps.Clone(md)
	lk.mu.Unlock()
	return nil
}

// Release cancels the lock's context (cause ErrReleased) unless it was
// already cancelled, stops renewing and deletes the lock at the store,
// owner-checked, bounded by ctx and RequestTimeout, so that the next waiter
// acquires it at once. It returns nil when the lock was held until
// released; an error matching ErrLockLost when it had been lost (its
// deadline passed, the store no longer held it, or MaxHold), with the
// reason; or the store's error, in which case the release is retried in the
// background until the store answers or the Locker is closed (the lock
// expires after its TTL regardless). Release is idempotent: later calls
// return the first call's result. Any goroutine may call it.
//
// With AcquireOptions.MinHold, a Release before MinHold has passed since
// the acquisition was sent returns nil at once, unless the lock was lost
// already, and the lock stays held, renewed, until then; it is released
// then, or as soon as it is lost or the Locker is closed.
func (lk *Lock) Release(ctx context.Context) error {
	if lk.p.minHold > 0 && lk.deferRelease() {
		return nil
	}
	return lk.release(ctx)
}

// deferRelease reports whether the release of a lock with MinHold waits
// (see Release): MinHold has not passed, the lock is held and the Locker
// is open. A goroutine then releases it when MinHold has passed, or the
// lock is lost or the Locker closed, whichever comes first.
func (lk *Lock) deferRelease() bool {
	wait := time.Until(lk.hold.Acquired().Add(lk.p.minHold))
	if wait <= 0 || !lk.hold.Held() {
		return false
	}
	if err := lk.l.beginShared(); err != nil {
		return false // closing: Close releases it
	}
	lk.mu.Lock()
	if lk.released || lk.releaseDeferred {
		deferred := lk.releaseDeferred
		lk.mu.Unlock()
		lk.l.ops.Done()
		return deferred
	}
	lk.releaseDeferred = true
	lk.mu.Unlock()
	go func() {
		defer lk.l.ops.Done()
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-lk.hold.Done(): // lost, or the Locker is closing
		}
		if err := lk.release(context.Background()); err != nil {
			lk.l.log.Warn("lock: release after MinHold", "key", lk.key, "err", err)
		}
	}()
	return true
}

// release is Release without MinHold.
func (lk *Lock) release(ctx context.Context) error {
	l := lk.l
	lk.mu.Lock()
	first := !lk.released
	lk.released = true
	lk.mu.Unlock()
	err := lk.hold.Release(ctx)
	if first && l.metrics {
		l.opts.Metrics.Released(l.opts.Class(lk.key), time.Since(lk.hold.Acquired()))
	}
	l.mu.Lock()
	delete(l.locks, lk)
	l.stopResetWatchLocked()
	l.wakeLocalLocked(lk.key)
	l.mu.Unlock()
	r := lk.hold.Stepped()
	var cause error
	if lostReason(r) {
		_, cause = lk.hold.Reason()
	}
	switch {
	case lostReason(r) && err != nil && !errors.Is(err, backend.ErrLeaseLost):
		return fmt.Errorf("lock: release %q: %w (and the release failed: %w)", lk.key, cause, err)
	case lostReason(r):
		return fmt.Errorf("lock: release %q: %w", lk.key, cause)
	case errors.Is(err, backend.ErrLeaseLost):
		// Stepped down by Release or Close, yet the store no longer held
		// it: it expired or was lost between two renewals.
		return newKeyError(lk.key, "lost: the store no longer held it at release", err, ErrLockLost)
	case err != nil:
		return fmt.Errorf("lock: release %q: %w", lk.key, err)
	}
	if l.log.Enabled(context.Background(), slog.LevelDebug) { // spares boxing the arguments
		l.log.Debug("lock: released", "key", lk.key, "term", lk.Term())
	}
	return nil
}
