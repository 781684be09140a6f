package etcdbackend

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SetSessionKeys makes a session lease full from n keys on (0: the
// default, sessionKeys) in every Backend, and returns a function that
// restores the previous setting.
func SetSessionKeys(n int) (restore func()) {
	old := sessionKeysOverride.Swap(int64(n))
	return func() { sessionKeysOverride.Store(old) }
}

// SessionKeys is the default number of keys from which a session lease is
// full.
const SessionKeys = sessionKeys

// AgeRetiredSessions makes every full session lease of b that may still
// have keys look d older than it is, as AgeSessions does for the current
// ones, and returns their IDs.
func AgeRetiredSessions(b *Backend, d time.Duration) []int64 {
	var out []int64
	for _, s := range b.sessionList() {
		s.mu.Lock()
		for id, r := range s.retired {
			r.lastSent = r.lastSent.Add(-d)
			s.retired[id] = r
			out = append(out, int64(id))
		}
		s.mu.Unlock()
	}
	return out
}

// KnowsLease reports whether b records keys it holds on etcd lease id.
func KnowsLease(b *Backend, id int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.owned[clientv3.LeaseID(id)]
	return ok
}
