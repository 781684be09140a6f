package lock

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// Sentinel errors, for errors.Is.
var (
	// ErrClosed is returned by methods called after Close, and by calls that
	// Close interrupted.
	ErrClosed = errors.New("lock: locker closed")
	// ErrInvalidOptions is wrapped by every error New, TryAcquire, Acquire,
	// TryDo and Do return for a bad option.
	ErrInvalidOptions = errors.New("lock: invalid options")
	// ErrInvalidKey is wrapped by every error returned for a key the Locker
	// or its backend cannot use.
	ErrInvalidKey = errors.New("lock: invalid key")
	// ErrHeld is matched by a *HeldError: the lock is held by someone else
	// (or by another *Lock of the same Locker).
	ErrHeld = errors.New("lock: held")
	// ErrLockLost is matched by the cause of a lock's context cancelled
	// because the lock was lost or no longer certain (renew deadline passed,
	// the store no longer holds it, MaxHold), and by the results of Release,
	// Do and TryDo after such a loss.
	ErrLockLost = errors.New("lock: lost")
	// ErrReleased is matched by the cause of a lock's context cancelled by
	// Release.
	ErrReleased = errors.New("lock: released")
	// ErrMaxHold is matched, together with ErrLockLost, by the cause of a
	// lock's context cancelled because the lock was held for
	// AcquireOptions.MaxHold.
	ErrMaxHold = errors.New("lock: max hold reached")
	// ErrPolicy is wrapped, together with the policy's own error, by the
	// error of an acquisition that Options.Policy refused.
	ErrPolicy = errors.New("lock: refused by policy")

	// ErrUnsupported is wrapped by the error of an acquisition whose
	// options (Shared, Limit, Hierarchical, Fair) the backend cannot serve:
	// it has no backend.Modes, or its ModeSupport lacks the part needed.
	// The Locker checks before any store call and never falls back to an
	// exclusive lock. It is backend.ErrUnsupported, so errors.Is matches
	// either name.
	ErrUnsupported = backend.ErrUnsupported
	// ErrLimitMismatch is wrapped by the error of a Shared acquisition
	// whose Limit differs from the limit the key's live Shared holders
	// acquired with. It is backend.ErrLimitMismatch.
	ErrLimitMismatch = backend.ErrLimitMismatch
)

// HeldError is returned when a lock is held by another holder: by TryAcquire
// and TryDo at once, by Acquire, Do and WaitFree when their context ends
// before the lock is free. errors.Is(err, ErrHeld) reports true for it (and
// errors.Is(err, backend.ErrHeld)); when a context ended the wait, Err is the
// context's error and errors.Is matches it too.
type HeldError struct {
	// Key is the lock key.
	Key string
	// Holder is the holder's record, read in the same round trip as the
	// failed attempt (or the last one seen, when a wait gave up): who, since
	// when by the store's clock, under which term, the TTL it had left and
	// its metadata. Holder.Key is the lock key, without the "lock/" prefix.
	// When several holders conflict (Shared holders, locks below a
	// hierarchical key), it is the oldest of them. When the attempt
	// yielded only to waiters (Holders is empty, Waiting is not), it is
	// the key's oldest holder, if any, or a record with only Key set; when
	// those waiters are the Exclusive waiters of an ancestor of a
	// hierarchical key, Holder.Key is that ancestor (and Holder its oldest
	// holder, if any).
	Holder backend.Record
	// Holders is every conflicting holder, in term order, with lock keys:
	// the Shared holders of the key, an Exclusive holder of an ancestor of
	// a hierarchical key (Key is the ancestor), or the locks below a key
	// whose intents conflict (Key is that lock's key). For an exclusive
	// lock held by one holder it is just Holder.
	Holders []backend.Record
	// Waiting is the number of waiters registered on the key that the
	// attempt had to yield to: an Exclusive waiter ahead of a Shared
	// acquisition (writer preference), the Exclusive waiters of an
	// ancestor ahead of a hierarchical acquisition (not Fair) or, with
	// Fair, earlier waiters; 0 when none or when the backend does not say.
	Waiting int
	// MayBeHeld reports that no holder was seen: the store found the lock
	// free but may have lost a live lease of it, because it restarted less
	// than a TTL ago (redisbackend's Options.RestartGuard), and refuses it
	// until Holder.TTL has passed. Holder then has only Key and TTL.
	MayBeHeld bool
	// Err is why a wait ended (ctx.Err()), or nil for a single attempt.
	Err error
}

// Error returns a message such as
// `lock "tally/42" held by "alice@host" (term 7) since 10:02:03`, or for
// Shared holders
// `lock "schema" held by 3 shared holders, the oldest "r1" (term 4) since 10:02:03`,
// or, when MayBeHeld,
// `lock "tally/42" may be held: the store restarted less than a TTL ago and may have lost its holder's lease; refused for 8.2s more`.
func (e *HeldError) Error() string {
	var b strings.Builder
	h := e.Holder
	shared := 0
	for _, r := range e.Holders {
		if r.Mode == backend.Shared {
			shared++
		}
	}
	fmt.Fprintf(&b, "lock %q", e.Key)
	switch {
	case e.MayBeHeld:
		fmt.Fprintf(&b, " may be held: the store restarted less than a TTL ago and may have lost its holder's lease; refused for %v more",
			h.TTL.Round(time.Millisecond))
		h = backend.Record{}
	case len(e.Holders) == 0 && e.Waiting > 0 && h.Key != "" && h.Key != e.Key:
		fmt.Fprintf(&b, " has %d exclusive waiting ahead on lock %q", e.Waiting, h.Key)
		h = backend.Record{}
	case len(e.Holders) == 0 && e.Waiting > 0:
		fmt.Fprintf(&b, " has %d waiting ahead", e.Waiting)
		h = backend.Record{}
	case h.Key != "" && h.Key != e.Key:
		fmt.Fprintf(&b, " conflicts with lock %q held by %q (%v, term %d)", h.Key, h.HolderID, h.Mode, h.Term)
	case shared > 0 && len(e.Holders) == shared:
		fmt.Fprintf(&b, " held by %d shared holder", shared)
		if shared > 1 {
			b.WriteString("s")
		}
		if h.Limit > 0 {
			fmt.Fprintf(&b, " (limit %d)", h.Limit)
		}
		fmt.Fprintf(&b, ", the oldest %q (term %d)", h.HolderID, h.Term)
	default:
		fmt.Fprintf(&b, " held by %q (term %d)", h.HolderID, h.Term)
	}
	if t := h.AcquiredAt; !t.IsZero() {
		b.WriteString(" since ")
		b.WriteString(formatSince(t))
	}
	if n := len(e.Holders); n > 1 && shared != n {
		fmt.Fprintf(&b, " (%d conflicting holders)", n)
	}
	if e.Waiting > 0 && len(e.Holders) > 0 {
		fmt.Fprintf(&b, ", %d waiting ahead", e.Waiting)
	}
	if e.Err != nil {
		b.WriteString(": gave up waiting: ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// formatSince writes t as a time of day when it is within the last day, with
// the date otherwise.
func formatSince(t time.Time) string {
	t = t.Local()
	if d := time.Since(t); d < 20*time.Hour && d > -time.Hour {
		return t.Format(time.TimeOnly)
	}
	return t.Format(time.DateTime)
}

// Is reports whether target is ErrHeld or backend.ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld || target == backend.ErrHeld }

// Unwrap returns Err.
func (e *HeldError) Unwrap() error { return e.Err }

// keyError is an error about one lock key that matches some sentinels and
// wraps an underlying error.
type keyError struct {
	key  string
	msg  string  // follows `lock "key" `
	is   []error // sentinels it matches
	err  error   // wrapped; may be nil
	errs []error // for Unwrap
}

func newKeyError(key, msg string, err error, is ...error) *keyError {
	e := &keyError{key: key, msg: msg, is: is, err: err}
	if err != nil {
		e.errs = []error{err}
	}
	return e
}

func (e *keyError) Error() string {
	s := fmt.Sprintf("lock %q %s", e.key, e.msg)
	if e.err != nil {
		s += ": " + e.err.Error()
	}
	return s
}

func (e *keyError) Is(target error) bool {
	for _, s := range e.is {
		if target == s {
			return true
		}
	}
	return false
}

func (e *keyError) Unwrap() []error { return e.errs }
