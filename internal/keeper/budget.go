package keeper

import "time"

// NoRetryBudget reports whether a renewal that times out cannot be
// retried before the deadline. The keeper renews every interval after the
// last renewal that succeeded, sends the next attempt of a failed renewal
// a quarter of the interval after the failed one was sent (at once when
// it failed later than that), and bounds each periodic attempt by
// AttemptBound: never longer than leaves time for one more attempt of a
// quarter interval before the deadline, never shorter than a quarter
// interval. So the retry of a renewal that timed out is sent by
// interval*5/4 at the latest, whatever the timeout, which must come before
// deadline. A renewal that fails fast is still retried; one lost packet,
// or a store that answers late once, then costs the lease.
func NoRetryBudget(interval, deadline time.Duration) bool {
	return interval+interval/4 >= deadline
}

// DefaultRenewInterval is the RenewInterval that the elector's and a
// Locker's options default to: TTL/2, or less when renewDeadline was set
// short (5/7 of it, the ratio of the defaults), so that a renewal that
// times out is still retried before it (NoRetryBudget).
func DefaultRenewInterval(ttl, renewDeadline time.Duration) time.Duration {
	return min(ttl/2, renewDeadline*5/7)
}

// AttemptBound is how long a periodic renewal attempt sent left before the
// hold's deadline may wait for its reply: timeout, but no longer than
// leaves a quarter of interval for one more attempt before the deadline,
// and no shorter than a quarter of interval (the spacing of attempts).
// With the defaults (interval TTL/2, deadline 0.7 TTL, timeout TTL/5) the
// first attempt waits 0.125 TTL and its retry has 0.075 TTL; at interval
// TTL/3 the first waits the full timeout.
func AttemptBound(interval, timeout, left time.Duration) time.Duration {
	return min(timeout, max(interval/4, left-interval/4))
}
