package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// expiryMargin is added to a holder's remaining TTL when scheduling the next
// attempt, so the attempt lands just after the lease expires at the store.
const expiryMargin = 5 * time.Millisecond

// minRetry is the shortest wait between two attempts on a held key, so a
// lease reported with (almost) no TTL left does not spin the loop.
const minRetry = 20 * time.Millisecond

// TryAcquire makes one attempt to acquire key. It returns the held *Lock, or
// a *HeldError (errors.Is(err, ErrHeld)) carrying the holder's record, read in
// the same round trip, when the key is held, by anyone, this Locker included.
// Other errors come from the backend (it is down, say) or wrap
// ErrInvalidKey, ErrInvalidOptions or ErrClosed. opts may be nil. ctx bounds
// the attempt only: the lock's own context is Lock.Context.
//
// TryAcquire does not queue behind this Locker's waiting Acquire calls.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts *AcquireOptions) (lk *Lock, err error) {
	if l.metrics {
		start := time.Now()
		defer func() { l.acquired(key, start, err) }()
	}
	bk, p, err := l.prepare(key, opts)
	if err != nil {
		return nil, err
	}
	// One context bounds the attempt and ends when Close begins: when ctx
	// is never cancelled, a context shared with the calls of the same
	// slice of RequestTimeout (no timer of its own, and Close ends it);
	// else ctx's own, which Close cancels through l.tries.
	if l.tryBounds.Shares(ctx, p.requestTimeout) {
		if err := l.beginShared(); err != nil {
			return nil, err
		}
		bctx, _ := l.tryBounds.Bound(ctx, p.requestTimeout)
		lk, err = l.attempt(bctx, key, bk, p, "", false, true, nil)
		l.ops.Done()
	} else {
		ctx, cancel := context.WithTimeout(ctx, p.requestTimeout)
		defer cancel()
		id, berr := l.beginTry(cancel)
		if berr != nil {
			return nil, berr
		}
		lk, err = l.attempt(ctx, key, bk, p, "", false, true, nil)
		l.endTry(id)
	}
	if err != nil && l.closeCtx.Err() != nil {
		return nil, fmt.Errorf("lock: acquire %q: %w", key, ErrClosed)
	}
	return lk, err
}

// Acquire waits until it holds key, or ctx ends. It subscribes to the
// backend's watch (when the backend has one) before its first attempt, so it
// wakes within a round trip of a release, and otherwise re-checks when the
// holder's lease would expire. Goroutines of this Locker waiting for the same
// key queue first come, first served; only the head of the queue talks to
// the backend (a head that acquires a Shared lock hands the turn on at once,
// so several goroutines of one Locker may hold a Shared lock together). When
// ctx ends first, the error is a *HeldError naming the last holder seen,
// which matches both ErrHeld and ctx.Err() (or, when no holder was ever seen
// because the backend kept failing, an error wrapping ctx.Err() and the last
// backend error). opts may be nil.
//
// On a backend with backend.Modes, an Exclusive Acquire that finds Shared
// holders, or hierarchical locks below its key, registers as a waiter (when
// ModeSupport has WriterFirst or AncestorWaiters), which refuses new Shared
// holders until it is served (writer preference) and, with
// AncestorWaiters, new hierarchical locks below its key (so a stream of
// locks below cannot starve it); a Fair Acquire registers in line at its
// first attempt. The registration is kept alive by re-trying at least every
// third of the TTL, and withdrawn (CancelWait) when the wait ends without
// the lock; a waiter that crashed stops counting after its TTL. A
// hierarchical Acquire blocked by a holder of an ancestor, or by an
// ancestor's Exclusive waiters, also watches that ancestor's key.
func (l *Locker) Acquire(ctx context.Context, key string, opts *AcquireOptions) (lk *Lock, err error) {
	if l.metrics {
		start := time.Now()
		defer func() { l.acquired(key, start, err) }()
	}
	bk, p, err := l.prepare(key, opts)
	if err != nil {
		return nil, err
	}
	ctx, end, err := l.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	q, w := l.enqueue(key)
	defer l.dequeue(key, w)
	select {
	case <-w.turn:
	case <-ctx.Done():
		return nil, l.gaveUp(ctx, "acquire", key, q.lastHeld(), nil)
	}
	return l.acquireHead(ctx, key, bk, p, q, w)
}

// prepare validates key and opts, checks that the backend can serve them and
// asks the policy, all before any store call.
func (l *Locker) prepare(key string, opts *AcquireOptions) (string, params, error) {
	bk, err := l.checkKey(key)
	if err != nil {
		return "", params{}, err
	}
	p, err := l.params(opts)
	if err != nil {
		return "", p, err
	}
	if p.hier {
		for i := range len(key) {
			if key[i] != '/' {
				continue
			}
			a := Prefix + key[:i]
			if err := l.b.ValidateKey(a); err != nil {
				return "", p, fmt.Errorf("%w: ancestor %q of %q: %w", ErrInvalidKey, key[:i], key, err)
			}
			p.ancestors = append(p.ancestors, a)
		}
	}
	if err := l.supports(&p); err != nil {
		return "", p, fmt.Errorf("lock: acquire %q: %w", key, err)
	}
	if l.opts.Policy != nil {
		var ao AcquireOptions
		if opts != nil {
			ao = *opts
			ao.Metadata = maps.Clone(opts.Metadata)
		}
		ao.TTL = p.ttl
		if err := l.opts.Policy(key, ao); err != nil {
			return "", p, fmt.Errorf("lock: acquire %q: %w: %w", key, ErrPolicy, err)
		}
	}
	return bk, p, nil
}

// supports returns an error wrapping ErrUnsupported when the backend cannot
// serve p. Hierarchical needs the capability even for a top-level key, so
// that a tree's options fail on every key alike.
func (l *Locker) supports(p *params) error {
	if !p.modes() {
		return nil
	}
	if l.modes == nil {
		var what []string
		if p.mode == Shared {
			what = append(what, "shared locks")
		}
		if p.hier {
			what = append(what, "hierarchical locks")
		}
		if p.fair {
			what = append(what, "fair queueing")
		}
		return fmt.Errorf("%w: %s: the backend does not implement backend.Modes", ErrUnsupported, strings.Join(what, ", "))
	}
	s := l.modes.ModeSupport()
	switch {
	case p.mode == Shared && !s.Shared:
		return fmt.Errorf("%w: shared locks", ErrUnsupported)
	case p.hier && !s.Hierarchical:
		return fmt.Errorf("%w: hierarchical locks", ErrUnsupported)
	case p.fair && !s.Fair:
		return fmt.Errorf("%w: fair queueing", ErrUnsupported)
	}
	return nil
}

// exclusiveWaits reports whether an Exclusive waiter registers: it then
// refuses new Shared holders (WriterFirst) and new hierarchical locks below
// its key (AncestorWaiters) while it waits.
func (l *Locker) exclusiveWaits() bool {
	if l.modes == nil {
		return false
	}
	ms := l.modes.ModeSupport()
	return ms.WriterFirst || ms.AncestorWaiters
}

// acquireHead is Acquire for the head of the key's local queue.
func (l *Locker) acquireHead(ctx context.Context, key, bk string, p params, q *keyQueue, w *waiter) (lk *Lock, err error) {
	sub := l.subscribe(ctx, bk, p.requestTimeout, p.renewInterval)
	defer sub.stop()
	// anc watches the ancestor whose Exclusive (or Shared) holder blocks a
	// hierarchical lock: its release is published on its own key only.
	var anc *subscription
	defer func() {
		if anc != nil {
			anc.stop()
		}
	}()
	// waitID registers this wait at the store: an Exclusive waiter blocks
	// new Shared holders (writer preference) and new hierarchical locks
	// below its key, a Fair one keeps its place. A plain Exclusive lock
	// stays on the fast path (backend.Acquire) while only Exclusive holders
	// of its key stand in its way, and registers, through AcquireMode, once
	// it finds Shared holders or locks below: readers that slipped in at a
	// release, and the locks below taken before it registered, are the last
	// to go before it.
	var waitID string
	register := p.modes()
	if p.fair || (p.mode == Exclusive && l.exclusiveWaits()) {
		waitID = backend.NewToken()
	}
	registered := false // an attempt carried waitID: the store may hold it
	defer func() {
		if registered && err != nil {
			l.cancelWait(ctx, key, bk, waitID, p)
		}
	}()
	var (
		lastErr  error
		failures int
		expiring int
		ahead    int // Fair: waiters in line before this one, at the last attempt
		// A waiter that lost contact with the store (see suspectWait)
		// reads the keys in its way instead of acquiring until
		// suspectUntil, unless it finds one of known, the leases it saw
		// in its way before.
		suspectUntil time.Time
		known        []backend.Record
		answered     bool // the store answered an attempt of this waiter
		// inWay holds the records of the holders that conflicts of this
		// wait named, by key and term, while they may live (see
		// heldUntil). A conflict that names none (waiters only) does not
		// forget them: the store may show a holder gone that still holds.
		inWay = map[heldKey]backend.Record{}
	)
	// subFor returns the subscription that tells of the renewals and
	// releases of r, a holder in the way: sub for a holder of key or a
	// lock below it (whose renewals and releases are published on key's
	// channel too), anc for a holder of the ancestor it watches; nil
	// otherwise.
	subFor := func(r backend.Record) *subscription {
		switch {
		case r.Key == key || isAncestor(key, r.Key):
			return sub
		case anc != nil && anc.key == Prefix+r.Key:
			return anc
		}
		return nil
	}
	// seed records how long each holder in held's way lives at least, by
	// the TTL the store gave its record (its renewals, heard later,
	// extend it; its release ends it): so a holder is accounted for from
	// the first conflict, before any renewal of it is heard.
	seed := func(held *HeldError, at time.Time) {
		for _, r := range held.Holders {
			if s := subFor(r); s != nil && s.renewals {
				s.holds(r.Term, at.Add(max(r.TTL, 0)+expiryMargin))
				inWay[heldKey{r.Key, r.Term}] = r
			}
		}
	}
	// heldUntil returns how long, by this waiter's clock, the holders
	// its conflicts named (inWay) keep it from the key, from the
	// renewals its watches told of (backend.RenewalWatcher): the latest
	// bound among them or, for a Shared acquisition with a Limit, at
	// least the Limit-th latest bound among the key's Shared holders (the
	// key is full until then). Every holder of the key, and every lock
	// below it, is in an Exclusive waiter's way: for one, so is every
	// renewal heard on the key, even of a holder that came after its
	// last attempt. Until then the waiter does not take the key, even
	// when the store shows it free: a store whose clock was stepped
	// forward (Redis times expiry by its wall clock) ends a lease early,
	// while its holder still holds it. Zero when there is none.
	heldUntil := func() time.Time {
		if !sub.renewals {
			return time.Time{}
		}
		now := time.Now()
		var until time.Time
		if p.mode == Exclusive {
			until = sub.latest()
		}
		var shared []time.Time
		for hk, r := range inWay {
			u := subFor(r).until(r.Term)
			if !u.After(now) {
				delete(inWay, hk) // gone, by its release or its TTL
				continue
			}
			if p.mode == Shared && p.limit > 0 && r.Key == key && r.Mode == Shared {
				shared = append(shared, u)
			} else {
				until = maxTime(until, u)
			}
		}
		if len(shared) >= p.limit && len(shared) > 0 {
			slices.SortFunc(shared, func(a, b time.Time) int { return b.Compare(a) })
			until = maxTime(until, shared[p.limit-1])
		}
		return until
	}
	suspect := func() {
		if !answered {
			return
		}
		suspectUntil = time.Now().Add(p.ttl + expiryMargin)
		if h := q.lastHeld(); h != nil {
			switch {
			case len(h.Holders) > 0:
				known = h.Holders
			case h.Holder.Token != "":
				known = []backend.Record{h.Holder}
			}
		}
	}
	// pause waits up to d before the next attempt (see waitTurn) and takes
	// a reset or break of the watch that came meanwhile: the store may
	// have restarted, and the wait starts again from it. It returns false
	// when ctx ended.
	pause := func(d time.Duration, ahead int) bool {
		// A registration must be refreshed in time: its wait is not
		// extended by the holders' renewals.
		var bound func() time.Time
		if !registered {
			bound = heldUntil
		}
		if !l.waitTurn(ctx, sub, anc, w.wake, d, ahead, bound) {
			return false
		}
		if sub.takeReset() {
			suspect()
		}
		return true
	}
	for {
		ahead = 0 // unless the attempt below says otherwise
		sub.ensure()
		if anc != nil {
			anc.ensure()
		}
		if time.Now().Before(suspectUntil) {
			wait, err := l.suspectWait(ctx, key, p, register, q, known, suspectUntil)
			switch {
			case err == nil && wait == 0:
				suspectUntil = time.Time{}
			case err == nil:
				if !pause(wait, 0) {
					return nil, l.gaveUp(ctx, "acquire", key, q.lastHeld(), lastErr)
				}
				continue
			case ctx.Err() != nil:
				return nil, l.gaveUp(ctx, "acquire", key, q.lastHeld(), lastErr)
			default:
				// A failed read does not prolong the wait (failures
				// that come and go must not keep the waiter waiting for
				// ever); a restart during it broke the watch, which
				// pause takes.
				failures++
				lastErr = err
				if !pause(backoff(p.renewInterval, failures), 0) {
					return nil, l.gaveUp(ctx, "acquire", key, q.lastHeld(), lastErr)
				}
				continue
			}
		}
		id := ""
		if register {
			id = waitID
		}
		// While a holder in the way may still hold the key (heldUntil), a
		// waiter does not take it: a registered one refreshes its
		// registration without taking the key (RegisterOnly), one that
		// is not waits.
		ronly := false
		if hu := heldUntil(); time.Now().Before(hu) {
			if id == "" {
				if !pause(time.Until(hu), 0) {
					return nil, l.gaveUp(ctx, "acquire", key, q.lastHeld(), lastErr)
				}
				continue
			}
			ronly = true
		}
		var crossed func() error
		if sub.ch != nil {
			crossed = func() error {
				if sub.broke() {
					return errCrossed
				}
				// The events that came with the reply are taken: a
				// renewal among them of a holder in the way (of any
				// holder, for an Exclusive waiter) that no release
				// followed crossed the acquisition.
				if heldUntil().After(time.Now()) {
					return errRenewalCrossed
				}
				return nil
			}
		}
		lk, err := l.attempt(ctx, key, bk, p, id, ronly, false, crossed)
		if id != "" {
			registered = true
		}
		if err == nil {
			return lk, nil
		}
		if errors.Is(err, errRenewalCrossed) {
			// Released; the check above waits until the renewal told of
			// is up, or its term's release.
			answered = true
			continue
		}
		if errors.Is(err, errCrossed) {
			// The store answered (the watch, then the acquisition) and
			// may have lost a live lease meanwhile: wait as after a
			// reset seen before the attempt.
			answered = true
			sub.takeReset()
			suspect()
			continue
		}
		var wait time.Duration
		var held *HeldError
		switch {
		case errors.As(err, &held):
			q.setLastHeld(held)
			seed(held, time.Now())
			failures = 0
			answered = true
			if p.fair {
				ahead = held.Waiting
			}
			if waitID != "" && !register && (sharedHolder(key, held) || lockBelow(key, held)) {
				register = true
				continue // register at once, through AcquireMode
			}
			if a := blockingAncestor(key, held); a != "" && (anc == nil || anc.key != Prefix+a) {
				if anc != nil {
					anc.stop()
				}
				anc = l.subscribe(ctx, Prefix+a, p.requestTimeout, p.renewInterval)
				seed(held, time.Now())
				if anc.ensure(); anc.ch != nil {
					continue // a release before the watch began would be missed
				}
			}
			if held.MayBeHeld {
				// No holder whose release would wake this waiter: the
				// store refuses the key for Holder.TTL more.
				wait = max(held.Holder.TTL, minRetry)
				expiring = 0
				break
			}
			ttl, ok := minTTL(held)
			if !ok {
				// Only waiters ahead: they hold no lease to wait out, and
				// the one ahead may have died (its registration expires).
				wait = p.ttl / 3
				expiring = 0
				break
			}
			wait = max(ttl, 0) + expiryMargin
			if ttl <= expiryMargin {
				// The lease should be gone but the store still holds it (etcd
				// expires leases in a periodic scan): back off rather than
				// hammer it; an expiry event still wakes the waiter at once.
				expiring++
				wait = max(wait, min(minRetry<<min(expiring-1, 10), p.renewInterval/2))
			} else {
				expiring = 0
			}
			wait = min(max(wait, minRetry), p.ttl)
		case errors.Is(err, backend.ErrRegisteredOnly):
			// The registration was refreshed; the store showed the key
			// free, but a holder in the way may still hold it.
			failures = 0
			answered = true
			wait = max(time.Until(heldUntil()), minRetry)
		case ctx.Err() != nil:
			return nil, l.gaveUp(ctx, "acquire", key, q.lastHeld(), lastErr)
		case errors.Is(err, backend.ErrInvalid), errors.Is(err, backend.ErrClosed), errors.Is(err, ErrClosed),
			errors.Is(err, ErrUnsupported), errors.Is(err, ErrLimitMismatch):
			return nil, err
		default:
			failures++
			lastErr = err
			if failures == 1 {
				suspect()
			}
			l.log.Warn("lock: acquire failed", "key", key, "err", err)
			wait = backoff(p.renewInterval, failures)
		}
		if registered {
			// Re-try before the registration's TTL runs out, so it never
			// lapses while this caller waits.
			wait = min(wait, p.ttl/3)
		}
		if !pause(wait, ahead) {
			return nil, l.gaveUp(ctx, "acquire", key, q.lastHeld(), lastErr)
		}
	}
}

// heldKey names a holder in a waiter's way: its lock key and term.
type heldKey struct {
	key  string
	term uint64
}

// suspectWait stands for an attempt of a waiter that lost contact with
// the store it had heard from (its watch was reset or broke, or an attempt
// failed), until the time until: the store may have restarted without a
// lease whose holder still holds it, and only that lease's TTL ends it. So
// the keys in the waiter's way are read, not acquired: key, and the keys
// of known, the leases the waiter saw in its way before (a Shared
// holder's, an ancestor's, a lock's below). One of known still there: the
// store kept its data, and wait is 0 (attempt as usual). Other holders of
// key: they are remembered, and the waiter waits for them or until. No
// holder: the waiter waits until until, when every lease the store could
// have lost has expired (assuming its holder used this waiter's TTL, as
// holders of one key usually do). register says the waiter acquires
// through backend.Modes, whose Holders reads every holder of a key.
func (l *Locker) suspectWait(ctx context.Context, key string, p params, register bool, q *keyQueue, known []backend.Record, until time.Time) (time.Duration, error) {
	keys := []string{key}
	for _, r := range known {
		if r.Key != "" && !slices.Contains(keys, r.Key) {
			keys = append(keys, r.Key)
		}
	}
	for _, k := range keys {
		recs, err := l.holdersOf(ctx, Prefix+k, register, p.requestTimeout)
		if err != nil {
			return 0, fmt.Errorf("lock: acquire %q: read after a reset: %w", key, err)
		}
		for _, r := range recs {
			if slices.ContainsFunc(known, func(kr backend.Record) bool {
				return kr.Token != "" && kr.Token == r.Token && kr.Term == r.Term
			}) {
				return 0, nil
			}
		}
		switch {
		case k != key:
		case len(recs) > 0:
			held := &HeldError{Key: key, Holder: userRecord(recs[0]), Holders: make([]backend.Record, len(recs))}
			for i, r := range recs {
				held.Holders[i] = userRecord(r)
			}
			q.setLastHeld(held)
		default:
			l.log.Info("lock: the key is free after a reset; waiting a TTL before acquiring, in case the store lost a live lease", "key", key)
		}
	}
	return max(time.Until(until), minRetry), nil
}

// holdersOf reads the holders of backend key bk: every holder through
// backend.Modes when modes is set, the one lease of Get otherwise.
func (l *Locker) holdersOf(ctx context.Context, bk string, modes bool, timeout time.Duration) ([]backend.Record, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if modes && l.modes != nil {
		return l.modes.Holders(cctx, bk)
	}
	rec, err := l.b.Get(cctx, bk)
	switch {
	case errors.Is(err, backend.ErrNotHeld):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return []backend.Record{rec}, nil
}

// waitTurn waits up to d before the next attempt of an acquireHead, as
// subscription.wait, and returns false when ctx ended. A Fair waiter with
// ahead waiters registered before it (as the store said at its last
// attempt) would only fail again at a release, which the first in line
// takes: it lets releases pass and counts the changes of the key, each an
// acquisition or a waiter leaving the line, and tries again once as many
// have passed as were ahead of it (or at d: its registration's refresh,
// which also corrects the count when an event was missed or a waiter
// ahead expired unannounced). So a hand-off in a line of n Fair waiters
// costs the store about two attempts, not n. Everyone else, and a Fair
// waiter first in line, tries again at any event.
func (l *Locker) waitTurn(ctx context.Context, sub, anc *subscription, wake <-chan struct{}, d time.Duration, ahead int, bound func() time.Time) bool {
	until := time.Now().Add(d)
	for {
		why, ok := sub.wait(ctx, time.Until(until), wake, anc, bound)
		switch {
		case !ok:
			return false
		case ahead == 0 || why == wokeOther || !time.Now().Before(until):
			return true
		case why == wokeChanged:
			if ahead--; ahead == 0 {
				return true
			}
		}
	}
}

// sharedHolder reports whether held names a Shared holder of key itself.
func sharedHolder(key string, held *HeldError) bool {
	for _, r := range held.Holders {
		if r.Key == key && r.Mode == Shared {
			return true
		}
	}
	return false
}

// lockBelow reports whether held names a lock below key (its intent on
// key is in the way).
func lockBelow(key string, held *HeldError) bool {
	for _, r := range held.Holders {
		if isAncestor(key, r.Key) {
			return true
		}
	}
	return false
}

// blockingAncestor returns the lock key of an ancestor of key whose holder
// is among held's holders, or whose Exclusive waiters refused the attempt
// (then Holders is empty and Holder.Key is that ancestor), or "".
func blockingAncestor(key string, held *HeldError) string {
	for _, r := range held.Holders {
		if isAncestor(r.Key, key) {
			return r.Key
		}
	}
	if len(held.Holders) == 0 && isAncestor(held.Holder.Key, key) {
		return held.Holder.Key
	}
	return ""
}

// isAncestor reports whether lock key a is an ancestor of lock key k in a
// hierarchy ("a" of "a/b", not of "ab").
func isAncestor(a, k string) bool {
	return a != "" && len(a) < len(k) && strings.HasPrefix(k, a) && k[len(a)] == '/'
}

// minTTL returns the least TTL left among held's holders, and false when it
// names none.
func minTTL(held *HeldError) (time.Duration, bool) {
	recs := held.Holders
	if len(recs) == 0 {
		return 0, false
	}
	m := recs[0].TTL
	for _, r := range recs[1:] {
		m = min(m, r.TTL)
	}
	return m, true
}

// cancelWait withdraws a wait's registration, bounded by RequestTimeout, even
// when ctx has ended.
func (l *Locker) cancelWait(ctx context.Context, key, bk, waitID string, p params) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.requestTimeout)
	defer cancel()
	if err := l.modes.CancelWait(cctx, bk, waitID); err != nil {
		l.log.Warn("lock: withdrawing a wait failed; it expires after its TTL", "key", key, "err", err)
	}
}

// gaveUp returns the error of a wait that ctx ended.
func (l *Locker) gaveUp(ctx context.Context, op, key string, last *HeldError, lastErr error) error {
	switch {
	case context.Cause(ctx) == ErrClosed:
		return fmt.Errorf("lock: %s %q: %w", op, key, ErrClosed)
	case last != nil:
		e := *last
		e.Err = ctx.Err()
		return &e
	case lastErr != nil:
		return fmt.Errorf("lock: %s %q: %w (last error: %w)", op, key, ctx.Err(), lastErr)
	}
	return fmt.Errorf("lock: %s %q: %w", op, key, ctx.Err())
}

// attempt makes one acquisition attempt and, when it succeeds, starts
// keeping the lease. A plain Exclusive lock without waitID takes the fast
// path, backend.Acquire; any other goes through backend.Modes.AcquireMode
// (waitID, when not empty, registers the caller as a waiter if the key is
// held; with registerOnly it only refreshes that registration, and never
// takes the key: see backend.ModeRequest.RegisterOnly). There is no read-back: either call is one atomic operation on the
// store (one script on Redis, one transaction on etcd) whose reply is the
// lease it wrote, so reading it back from the same store would cost a round
// trip per lock and prove nothing more. Call Lock.Verify before an
// irreversible step to check the lock is still held.
// When bounded, ctx already bounds the attempt by RequestTimeout.
func (l *Locker) attempt(ctx context.Context, key, bk string, p params, waitID string, registerOnly, bounded bool, crossed func() error) (*Lock, error) {
	req := backend.AcquireRequest{
		Key: bk, HolderID: l.id, TTL: p.ttl, Metadata: p.metadata,
		// A lock that stops renewing on its own (NoRenew, MaxHold) must
		// end at its TTL: on a backend that keeps an instance's leases
		// alive together (etcd's session), a shared lease would outlive it.
		Detached: p.noRenew || p.maxHold > 0,
	}
	sent := time.Now()
	cctx, cancel := ctx, context.CancelFunc(nil)
	if !bounded {
		cctx, cancel = context.WithTimeout(ctx, p.requestTimeout)
	}
	var (
		lease backend.Lease
		err   error
	)
	if p.modes() || waitID != "" {
		lease, err = l.modes.AcquireMode(cctx, backend.ModeRequest{
			AcquireRequest: req, Mode: p.mode, Limit: p.limit, Ancestors: p.ancestors, Fair: p.fair, WaitID: waitID,
			RegisterOnly: registerOnly,
		})
	} else {
		lease, err = l.b.Acquire(cctx, req)
	}
	if cancel != nil {
		cancel()
	}
	if err != nil {
		var held *backend.HeldError
		if errors.As(err, &held) {
			return nil, heldError(key, held)
		}
		return nil, fmt.Errorf("lock: acquire %q: %w", key, err)
	}
	if registerOnly {
		// A backend that does not know RegisterOnly took the key: it is
		// given back at once.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.requestTimeout)
		if err := l.b.Release(rctx, lease); err != nil && !errors.Is(err, backend.ErrLeaseLost) {
			l.log.Warn("lock: releasing an acquisition made to register only", "key", key, "err", err)
		}
		cancel()
		return nil, fmt.Errorf("lock: acquire %q: %w", key, backend.ErrRegisteredOnly)
	}
	if crossed != nil {
		if cerr := crossed(); cerr != nil {
			why := "the watch broke while the acquisition was in flight; releasing it and waiting a TTL, in case the store lost a live lease"
			if errors.Is(cerr, errRenewalCrossed) {
				why = "a holder in the way renewed while the acquisition was in flight; releasing it and waiting out that renewal, in case the store's clock stepped forward"
			}
			l.log.Info("lock: "+why, "key", key, "term", lease.Term)
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.requestTimeout)
			if err := l.b.Release(rctx, lease); err != nil && !errors.Is(err, backend.ErrLeaseLost) {
				// It expires by its TTL: nobody holds the lock on it.
				l.log.Warn("lock: releasing an acquisition given up", "key", key, "err", err)
			}
			cancel()
			return nil, cerr
		}
	}
	lk, err := l.start(key, lease, sent, p)
	if err != nil {
		return nil, err
	}
	if l.log.Enabled(context.Background(), slog.LevelDebug) { // spares boxing the arguments
		l.log.Debug("lock: acquired", "key", key, "term", lease.Term, "mode", p.mode)
	}
	return lk, nil
}

// errCrossed is attempt's error when crossed reported that the waiter's
// watch broke while the acquisition was in flight: the store may have
// restarted in between (a client retries a command on a new connection)
// and found the key free only because it lost a live lease. The
// acquisition was released.
var errCrossed = errors.New("lock: the watch broke while the acquisition was in flight")

// errRenewalCrossed is attempt's error when crossed reported that a
// renewal of a holder in the waiter's way came with the acquisition's
// reply, and no release of its term: a renewal is owner-checked, so it ran
// before the acquisition, and the store found the key free while that
// holder held it (a forward step of its clock, a deletion). The
// acquisition was released; the waiter waits until the renewal is up or
// its term is released (a hand-over whose release message came after the
// reply).
var errRenewalCrossed = errors.New("lock: a renewal of a holder in the way crossed the acquisition")

// heldError turns the backend's HeldError into the package's, with lock keys.
func heldError(key string, held *backend.HeldError) *HeldError {
	e := &HeldError{Key: key, Holder: userRecord(held.Holder), Waiting: held.Waiting, MayBeHeld: held.MayBeHeld}
	switch {
	case held.MayBeHeld:
		// No holder: the store may have lost it (see MayBeHeld).
	case len(held.Holders) > 0:
		e.Holders = make([]backend.Record, len(held.Holders))
		for i, r := range held.Holders {
			e.Holders[i] = userRecord(r)
		}
	case held.Waiting > 0:
		// Yielded to waiters only: Holder, if any, is not in the way.
	case held.Holder.HolderID != "":
		e.Holders = []backend.Record{e.Holder}
	}
	return e
}

// Do acquires key like Acquire, calls fn with a context that is cancelled
// the moment the lock is lost (or ctx ends, or Close is called), and
// releases the lock once fn has returned, renewing it meanwhile, so nobody
// else acquires it while fn winds down. It returns fn's error; when the lock
// was lost while fn ran, the result is fn's error joined (errors.Join: one
// line each) with Release's, which matches ErrLockLost and carries the
// reason. When the lock cannot be acquired, Do returns Acquire's error
// and never calls fn; nor when ctx ended while the acquisition's reply was
// on its way (the lock is then released at once, and the error matches
// ctx's). A failed release is retried in the background and
// logged, not returned. After a pause (a long GC pause, SIGSTOP) the timer
// that cancels fn's context falls due together with fn's own timers, and a
// select may see fn's first: call Lock.Held, which reads the clock, right
// before each action (when it answers false, Lock.Err already says why).
func (l *Locker) Do(ctx context.Context, key string, opts *AcquireOptions, fn func(ctx context.Context, l *Lock) error) error {
	return l.do(ctx, key, opts, fn, l.Acquire)
}

// TryDo is Do with a single attempt, like TryAcquire: when key is held it
// returns the *HeldError at once without calling fn.
func (l *Locker) TryDo(ctx context.Context, key string, opts *AcquireOptions, fn func(ctx context.Context, l *Lock) error) error {
	return l.do(ctx, key, opts, fn, l.TryAcquire)
}

// do acquires key with acquire, then runs fn under the lock.
func (l *Locker) do(ctx context.Context, key string, opts *AcquireOptions, fn func(context.Context, *Lock) error,
	acquire func(context.Context, string, *AcquireOptions) (*Lock, error)) error {
	if fn == nil {
		return fmt.Errorf("%w: nil function", ErrInvalidOptions)
	}
	cctx, end, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	lk, err := acquire(cctx, key, opts)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		// The caller gave up while the acquisition's reply was on its way:
		// the lock is given back at once, and fn does not start.
		if err := lk.release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, ErrLockLost) { // not kept for MinHold: fn never ran
			l.log.Warn("lock: releasing an acquisition that completed after the caller gave up; it expires by its TTL", "key", key, "err", err)
		}
		return fmt.Errorf("lock %q: acquired after the caller gave up, and released: %w", key, context.Cause(ctx))
	}
	return l.run(ctx, lk, fn)
}

// run calls fn while lk is held, then releases lk.
func (l *Locker) run(ctx context.Context, lk *Lock, fn func(context.Context, *Lock) error) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.Context(), func() { cancel(context.Cause(lk.Context())) })
	var stopCancelled func() bool
	defer func() {
		// Unregistered before cancel(nil), so the end of fn starts no
		// goroutine for fnCancelled.
		stop()
		stopCancelled()
		cancel(nil)
		lk.fnDone()
		relErr := lk.Release(context.WithoutCancel(ctx))
		switch {
		case errors.Is(relErr, ErrLockLost):
			err = errors.Join(err, relErr)
		case relErr != nil:
			l.log.Warn("lock: release after the function returned failed; retrying in the background", "key", lk.key, "err", relErr)
		}
		if cause := context.Cause(lk.Context()); errors.Is(cause, ErrClosed) && !errors.Is(err, ErrClosed) {
			err = errors.Join(err, cause)
		}
	}()
	lk.fnStarted()
	stopCancelled = context.AfterFunc(fctx, lk.fnCancelled)
	return fn(fctx, lk)
}

// WaitFree blocks until key is free, without acquiring it, or until ctx ends
// (then it returns a *HeldError naming the last holder seen and matching
// ctx.Err(), or ctx's error when the backend kept failing). Like Acquire it
// is woken by the backend's watch, or re-checks when the holder's lease
// would expire. The key may be taken again by the time WaitFree returns.
// It reads the key, as Holders does: after a store restart that lost the
// key's lease, it sees the key free even while a Redis backend's
// RestartGuard still refuses to hand it out (an Acquire then gets a
// HeldError with MayBeHeld).
func (l *Locker) WaitFree(ctx context.Context, key string) error {
	bk, err := l.checkKey(key)
	if err != nil {
		return err
	}
	ctx, end, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	o := &l.opts
	sub := l.subscribe(ctx, bk, o.RequestTimeout, o.RenewInterval)
	defer sub.stop()
	var (
		last     *HeldError
		lastErr  error
		failures int
	)
	for {
		sub.ensure()
		cctx, cancel := context.WithTimeout(ctx, o.RequestTimeout)
		rec, err := l.b.Get(cctx, bk)
		cancel()
		var wait time.Duration
		switch {
		case errors.Is(err, backend.ErrNotHeld):
			return nil
		case err == nil:
			r := userRecord(rec)
			last, failures = &HeldError{Key: key, Holder: r, Holders: []backend.Record{r}}, 0
			wait = min(max(max(rec.TTL, 0)+expiryMargin, minRetry), o.TTL)
		case ctx.Err() != nil:
			return l.gaveUp(ctx, "wait free", key, last, lastErr)
		default:
			failures++
			lastErr = err
			wait = backoff(o.RenewInterval, failures)
		}
		if _, ok := sub.wait(ctx, wait, nil, nil, sub.latest); !ok {
			return l.gaveUp(ctx, "wait free", key, last, lastErr)
		}
	}
}

// subscription is a waiter's watch on one backend key, re-established after
// the channel closes, with backoff when subscribing fails.
type subscription struct {
	l          *Locker
	ctx        context.Context
	key        string
	timeout    time.Duration // bound on one Watch call
	interval   time.Duration // base of the backoff
	ch         <-chan backend.Event
	cancel     context.CancelFunc
	failures   int
	next       time.Time // no subscription attempt before this
	off        bool      // the backend cannot watch
	resubbed   bool      // set by ensure when a subscription replaced a closed one
	everClosed bool
	// renewals says the watch tells of renewals (backend.RenewalWatcher).
	renewals bool
	// renewed maps the term of each lease or entry of the key (or below
	// it) that the watch told was renewed, or that an attempt found in the
	// way, to how long it lives at least by this waiter's clock: the
	// renewal's (or the record's) TTL from when it was heard. A release of
	// the term deletes it; a release of unknown term, or an expiry, clears
	// them all.
	renewed   map[uint64]time.Time
	lostTouch bool // an EventReset came, or the channel closed, since the last takeReset
}

// holds records that the lease or entry of term lives at least until
// until, by this waiter's clock. Bounds that have passed are dropped.
func (s *subscription) holds(term uint64, until time.Time) {
	if s.renewed == nil {
		s.renewed = make(map[uint64]time.Time)
	}
	now := time.Now()
	maps.DeleteFunc(s.renewed, func(_ uint64, u time.Time) bool { return !u.After(now) })
	if until.After(s.renewed[term]) {
		s.renewed[term] = until
	}
}

// heard takes an event's news of the holders' lifetimes: a renewal
// extends its term's, a release ends its term's (every term's when it
// does not say which), an expiry ends them all.
func (s *subscription) heard(ev backend.Event) {
	switch {
	case ev.Type == backend.EventRenewed:
		s.holds(ev.Term, time.Now().Add(ev.TTL+expiryMargin))
	case ev.Type == backend.EventReleased && ev.Term != 0:
		delete(s.renewed, ev.Term)
	case ev.Type == backend.EventReleased || ev.Type == backend.EventExpired:
		clear(s.renewed)
	}
}

// until returns how long the lease or entry of term lives at least, by
// this waiter's clock (zero when it knows of no bound).
func (s *subscription) until(term uint64) time.Time {
	if s == nil {
		return time.Time{}
	}
	return s.renewed[term]
}

// latest returns the latest bound of any term (zero when none).
func (s *subscription) latest() time.Time {
	var u time.Time
	for _, t := range s.renewed {
		u = maxTime(u, t)
	}
	return u
}

// takeReset reports whether the subscription was reset or broken since the
// last call: the store may have restarted meanwhile.
func (s *subscription) takeReset() bool {
	r := s.lostTouch
	s.lostTouch = false
	return r
}

func (l *Locker) subscribe(ctx context.Context, key string, timeout, interval time.Duration) *subscription {
	_, renewals := l.b.(backend.RenewalWatcher)
	return &subscription{l: l, ctx: ctx, key: key, timeout: timeout, interval: interval, off: l.watcher == nil, renewals: renewals}
}

// watch subscribes to the key, with renewal events when the backend can
// tell of them.
func (s *subscription) watch(ctx context.Context) (<-chan backend.Event, error) {
	if rw, ok := s.l.b.(backend.RenewalWatcher); ok {
		return rw.WatchRenewals(ctx, s.key, nil)
	}
	return s.l.watcher.Watch(ctx, s.key)
}

// ensure subscribes when there is no live subscription and one may be tried
// now. Changes made after a successful ensure are delivered.
func (s *subscription) ensure() {
	if s.off || s.ch != nil || time.Now().Before(s.next) || s.ctx.Err() != nil {
		return
	}
	wctx, cancel := context.WithCancel(s.ctx)
	// The subscription lives as long as wctx, so its timeout cancels wctx
	// only while Watch has not returned.
	t := time.AfterFunc(s.timeout, cancel)
	ch, err := s.watch(wctx)
	if !t.Stop() && err == nil {
		err = fmt.Errorf("watch %q: timed out after %v", s.key, s.timeout)
	}
	if err != nil {
		cancel()
		if errors.Is(err, errors.ErrUnsupported) {
			s.off = true
			return
		}
		if s.ctx.Err() == nil {
			s.failures++
			s.next = time.Now().Add(backoff(s.interval, s.failures))
			s.l.log.Warn("lock: watch failed", "key", s.key, "err", err)
		}
		return
	}
	s.ch, s.cancel = ch, cancel
	s.resubbed = s.everClosed
}

// woke says what ended a wait.
type woke int

const (
	wokeOther    woke = iota // the time ran out, a local wake-up, a closed watch, an ancestor's event
	wokeReleased             // s's key was released or expired
	wokeChanged              // s's key changed (an acquisition, a waiter leaving the line)
)

// wait blocks for d, until an event arrives on s or on also (which may be
// nil), wake fires, or ctx ends (then ok is false). A closed channel ends
// the wait too, after re-subscribing when allowed, since changes may have
// been missed. why says what ended it. A renewal (of s's key or also's)
// does not end it: when bound is not nil, the wait lasts at least until
// bound(), re-read at each renewal, how long the holders in the way live
// at least by the renewals heard (see subscription.renewed), so that a key
// the store shows free before then (its clock stepped forward, the key
// evicted or deleted by hand) is not taken while a holder may still hold
// it; only the leases' own TTLs end it.
func (s *subscription) wait(ctx context.Context, d time.Duration, wake <-chan struct{}, also *subscription, bound func() time.Time) (why woke, ok bool) {
	if bound != nil {
		d = max(d, time.Until(bound()))
	}
	if !s.off && s.ch == nil {
		d = min(d, max(time.Until(s.next), 0))
	}
	var alsoCh <-chan backend.Event
	if also != nil {
		if !also.off && also.ch == nil {
			d = min(d, max(time.Until(also.next), 0))
		}
		alsoCh = also.ch
	}
	end := time.Now().Add(d)
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return wokeOther, false
		case <-t.C:
		case <-wake:
		case ev, ok := <-s.ch:
			switch {
			case !ok:
				s.closed()
			case ev.Type == backend.EventRenewed:
				s.heard(ev)
				if bound != nil {
					if u := bound(); u.After(end) {
						end = u
						t.Reset(time.Until(end))
					}
				}
				continue
			case ev.Type == backend.EventReset:
				s.lostTouch = true
			case ev.Type == backend.EventReleased || ev.Type == backend.EventExpired:
				s.heard(ev)
				why = wokeReleased
			case ev.Type == backend.EventChanged:
				why = wokeChanged
			}
		case ev, ok := <-alsoCh:
			if !ok {
				also.closed()
				break
			}
			also.heard(ev)
			if ev.Type == backend.EventRenewed {
				// The ancestor's holder renewed: nothing to look at.
				if bound != nil {
					if u := bound(); u.After(end) {
						end = u
						t.Reset(time.Until(end))
					}
				}
				continue
			}
		}
		return why, ctx.Err() == nil
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// broke reports, without blocking, whether s's channel has closed or
// holds an EventReset: the connection to the store broke since the waiter
// last received from it. It takes the events waiting in the channel; the
// caller is done waiting (it holds the lock) or re-reads the key.
func (s *subscription) broke() bool {
	for range 1024 { // bounded, in case events keep coming as fast as they are taken
		select {
		case ev, ok := <-s.ch:
			if !ok {
				s.closed()
				return true
			}
			switch ev.Type {
			case backend.EventReset:
				s.lostTouch = true
				return true
			case backend.EventRenewed, backend.EventReleased, backend.EventExpired:
				s.heard(ev)
			}
		default:
			return false
		}
	}
	return false
}

// closed records that the channel was closed: the next ensure subscribes
// again, at once the first time and after a backoff when it keeps closing.
func (s *subscription) closed() {
	s.lostTouch = true
	s.cancel()
	s.ch, s.cancel = nil, nil
	if s.everClosed {
		s.failures++
		s.next = time.Now().Add(backoff(s.interval, s.failures))
	}
	s.everClosed = true
}

// stop ends the subscription.
func (s *subscription) stop() {
	if s.cancel != nil {
		s.cancel()
	}
}

// backoff returns the delay before retry n (1-based) after backend errors:
// exponential from interval/8 up to interval, with jitter.
func backoff(interval time.Duration, n int) time.Duration {
	d := interval / 8
	for i := 1; i < n && d < interval; i++ {
		d *= 2
	}
	d = max(min(d, interval), time.Millisecond)
	return d/2 + rand.N(d/2+1)
}

// keyQueue is the local FIFO of one Locker's goroutines waiting for a key.
// Only its head talks to the backend. Guarded by Locker.mu.
type keyQueue struct {
	waiters []*waiter // guarded by Locker.mu

	mu   sync.Mutex // guards last
	last *HeldError // the last conflict the head saw
}

type waiter struct {
	turn chan struct{} // closed when the waiter becomes the head
	wake chan struct{} // capacity 1: this Locker released the key
}

// enqueue appends a waiter for key.
func (l *Locker) enqueue(key string) (*keyQueue, *waiter) {
	w := &waiter{turn: make(chan struct{}), wake: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[key]
	if q == nil {
		q = &keyQueue{}
		l.queues[key] = q
	}
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		close(w.turn)
	}
	return q, w
}

// dequeue removes w from key's queue and, if it was the head, hands the turn
// to the next waiter.
func (l *Locker) dequeue(key string, w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[key]
	for i, x := range q.waiters {
		if x != w {
			continue
		}
		q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
		if i == 0 && len(q.waiters) > 0 {
			close(q.waiters[0].turn)
		}
		break
	}
	if len(q.waiters) == 0 {
		delete(l.queues, key)
	}
}

// wakeLocalLocked tells the head of key's local queue that this Locker
// released the key, so it retries without waiting for the watch. l.mu must
// be held.
func (l *Locker) wakeLocalLocked(key string) {
	if q := l.queues[key]; q != nil && len(q.waiters) > 0 {
		select {
		case q.waiters[0].wake <- struct{}{}:
		default:
		}
	}
}

func (q *keyQueue) setLastHeld(e *HeldError) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.last = e
}

func (q *keyQueue) lastHeld() *HeldError {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.last
}
