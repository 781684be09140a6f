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
	Holder backend.Record
	// Err is why a wait ended (ctx.Err()), or nil for a single attempt.
	Err error
}

// Error returns a message such as
// `lock "tally/42" held by "alice@host" (term 7) since 10:02:03`.
func (e *HeldError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lock %q held by %q (term %d)", e.Key, e.Holder.HolderID, e.Holder.Term)
	if t := e.Holder.AcquiredAt; !t.IsZero() {
		b.WriteString(" since ")
		b.WriteString(formatSince(t))
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
