package etcdbackend

import (
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// sessionKeys is the number of keys this Backend holds on one session lease
// (its acquisitions, entries, intents and waiter registrations, as recorded
// in owned) from which the next acquisition of that TTL goes on a new
// session lease instead (see sessionFull). Every renewal of a session looks
// up all the keys attached to it (RenewBatch), so the cost of one renewal
// grows with the keys on its session: with 100,000 locks on one lease each
// of the keeper's batches (up to 4,096 leases) looked up all 100,000 keys,
// one batch after the other, and the last batches came back after their
// locks' deadlines (issue #13). With this cap, one look-up returns at most
// about sessionKeys keys, and a batch of the keeper's spans a few sessions,
// whose look-ups and keep-alives go out together.
const sessionKeys = 2048

// sessionKeysOverride, when positive, replaces sessionKeys (a test hook).
var sessionKeysOverride atomic.Int64

// sessionKeyCap returns the number of keys from which a session lease is
// full.
func sessionKeyCap() int {
	if n := sessionKeysOverride.Load(); n > 0 {
		return int(n)
	}
	return sessionKeys
}

// sessionFull reports whether this Backend holds sessionKeyCap keys or more
// on session lease id. The bound is soft: acquisitions that were handed id
// before it filled and have not committed yet are not counted, so a lease
// can end up with that many more keys (at most the acquisitions in flight
// at once).
//
// A full lease stays as it is: its keys are renewed, owner-checked and
// swept for orphans exactly as before (RenewBatch groups leases by the
// session lease in their token, not by TTL), it is kept alive by their
// renewals, and it expires on its own TTL once the last of them is
// released or lost, as a session whose keys are all released does. Only
// new acquisitions go on the next lease.
func (b *Backend) sessionFull(id clientv3.LeaseID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.owned[id]) >= sessionKeyCap()
}

// retiredLease is a full session lease that may still have keys: its
// granted TTL, in seconds, and the send time of its grant or last
// keep-alive that succeeded.
type retiredLease struct {
	ttl      int64
	lastSent time.Time
}

// pruneRetiredLocked forgets the full session leases of s that have
// expired by the local clock at now (their TTL passed since the send time
// of their last grant or keep-alive that succeeded, so etcd has ended them
// and every key on them): what this Backend recorded of their keys goes,
// as it does for the current session lease when it is granted again. It
// runs with s.mu held.
func (b *Backend) pruneRetiredLocked(s *session, now time.Time) {
	for id, r := range s.retired {
		if now.Sub(r.lastSent) >= time.Duration(r.ttl)*time.Second {
			delete(s.retired, id)
			b.forgetLease(id)
		}
	}
}
