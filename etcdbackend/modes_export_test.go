package etcdbackend

import "time"

// ExpireRegistrations runs, on every session of b, the withdrawal of the
// waiter registrations that are due at at, as their timer would then.
func ExpireRegistrations(b *Backend, at time.Time) {
	for _, s := range b.sessionList() {
		b.expireRegistrations(s, at)
	}
}

// RegistrationTimer returns the earliest instant a timer of b's sessions
// is armed for (zero: none).
func RegistrationTimer(b *Backend) time.Time {
	var first time.Time
	for _, s := range b.sessionList() {
		s.regMu.Lock()
		if !s.timerAt.IsZero() && (first.IsZero() || s.timerAt.Before(first)) {
			first = s.timerAt
		}
		s.regMu.Unlock()
	}
	return first
}

// OnWithdrawal makes f run in b's withdrawal of due waiter registrations
// (expireRegistrations) at stage "delete" (the due registrations taken
// out, their delete not yet sent) and "done" (the withdrawal recorded).
// nil removes it.
func OnWithdrawal(b *Backend, f func(stage string)) {
	if f == nil {
		b.withdrawalHook.Store(nil)
		return
	}
	b.withdrawalHook.Store(&f)
}

// KnowsWait reports whether b remembers registration waitID of key (its
// place in line).
func KnowsWait(b *Backend, key, waitID string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.waits[waitMapKey(key, waitID)]
	return ok
}
