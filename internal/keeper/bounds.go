package keeper

import (
	"context"
	"sync/atomic"
	"time"
)

// boundSlices is the number of slices a Bounds cuts its timeout into: calls
// that start within one slice share one context, so a call is given at
// least (boundSlices-1)/boundSlices of the timeout and never more.
const boundSlices = 16

// Bounds hands out contexts that bound calls by one fixed timeout without
// a timer of their own: the calls that start within the same slice of the
// timeout (1/16 of it) share one context with a deadline, derived from the
// parent given to NewBounds, so a stream of short calls costs one timer per
// slice instead of one per call. A call so bounded ends no later than the
// timeout after it started, and no earlier than 15/16 of it (or when the
// parent ends). Its methods are safe for concurrent use; a nil *Bounds makes
// every call's own context.WithTimeout.
type Bounds struct {
	parent  context.Context
	timeout time.Duration
	slice   time.Duration
	cur     atomic.Pointer[boundSlot]
}

// boundSlot is the context shared by the calls of one slice.
type boundSlot struct {
	ctx    context.Context
	cancel context.CancelFunc // never called early: calls in flight share ctx; kept for vet
	start  time.Time          // when the slice began: ctx's deadline is start + timeout
}

// NewBounds returns a Bounds for calls bounded by timeout (which must be
// positive) whose contexts also end when parent ends.
func NewBounds(parent context.Context, timeout time.Duration) *Bounds {
	return &Bounds{parent: parent, timeout: timeout, slice: max(timeout/boundSlices, 1)}
}

// Bound returns a context bounded by ctx and by timeout, and the function
// to call when the call is over (always, as for context.WithTimeout). When
// ctx can never be cancelled (its Done is nil: context.Background, or
// WithoutCancel) and timeout is b's, the context is b's current shared one,
// carrying ctx's values, and ends when b's parent ends too; otherwise it is
// context.WithTimeout(ctx, timeout), which b's parent does not end.
func (b *Bounds) Bound(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if b == nil || timeout != b.timeout || ctx.Done() != nil {
		return context.WithTimeout(ctx, timeout)
	}
	s := b.slot(time.Now())
	if ctx == context.Background() || ctx == context.TODO() {
		return s.ctx, nop
	}
	return &boundCtx{Context: s.ctx, values: ctx}, nop
}

// Shares reports whether Bound(ctx, timeout) returns a context that b's
// parent ends.
func (b *Bounds) Shares(ctx context.Context, timeout time.Duration) bool {
	return b != nil && timeout == b.timeout && ctx.Done() == nil
}

func nop() {}

// slot returns the context of the slice now is in, making it when the
// current one began a slice or more ago.
func (b *Bounds) slot(now time.Time) *boundSlot {
	s := b.cur.Load()
	// The monotonic clock never goes back: s.start <= now, so s's deadline
	// is no later than now + timeout.
	if s != nil && now.Sub(s.start) < b.slice {
		return s
	}
	n := &boundSlot{start: now}
	// Its timer cancels it at the deadline; it is not cancelled earlier,
	// since calls in flight share it.
	n.ctx, n.cancel = context.WithDeadline(b.parent, now.Add(b.timeout))
	b.cur.CompareAndSwap(s, n) // a concurrent caller's slot is as good
	return n
}

// boundCtx is a shared slot's context carrying the values of a caller's
// context that is never cancelled.
type boundCtx struct {
	context.Context                 // the slot's: Deadline, Done, Err
	values          context.Context // the caller's: Value
}

func (c *boundCtx) Value(key any) any { return c.values.Value(key) }

// AfterFunc lets contexts derived from c register with the slot's context
// (context.WithCancel and the like look for it) instead of starting a
// goroutine each to watch it.
func (c *boundCtx) AfterFunc(f func()) func() bool { return context.AfterFunc(c.Context, f) }
