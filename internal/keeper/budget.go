package keeper

import "time"

// NoRetryBudget reports whether a renewal that times out cannot be
// retried before the deadline: the keeper renews every interval after the
// last renewal that succeeded, cuts a call at timeout and retries a failed
// renewal a quarter of the interval after the failure, so the retry of a
// renewal that timed out is sent at interval + timeout + interval/4 at the
// latest, which must come before deadline. A renewal that fails fast is
// still retried; one lost packet, or a store that answers late once, then
// costs the lease.
func NoRetryBudget(interval, timeout, deadline time.Duration) bool {
	return interval+timeout+interval/4 >= deadline
}
