package etcdbackend

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

// CleanUp starts the background clean-up of lease l, a lease on one of b's
// sessions, that a Release or an acquisition whose outcome is unknown
// starts (cleanUp).
func CleanUp(b *Backend, l backend.Lease) {
	id, _ := parseToken(l.Token)
	b.cleanUp(l.Key, id, l.Token, l.HolderID)
}

// DeleteOrphans runs RenewBatch's deletion of the etcd keys orphans from
// session lease id, found by a look-up at revision rev (deleteOrphans).
func DeleteOrphans(ctx context.Context, b *Backend, id int64, orphans []string, rev int64) {
	b.deleteOrphans(ctx, clientv3.LeaseID(id), orphans, rev)
}

// SessionToken returns the token of a lease on session lease id acquired
// at acquiredAt (newSessionToken).
func SessionToken(id int64, acquiredAt time.Time) string {
	return newSessionToken(clientv3.LeaseID(id), acquiredAt)
}

// Owns reports whether b counts key, or an etcd key of an entry of key, as
// held on one of its session leases (own, disown).
func Owns(b *Backend, key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.owned {
		for k := range m {
			if k == key || strings.HasPrefix(k, key+"\x00") {
				return true
			}
		}
	}
	return false
}

// CleanUpEntries starts the background clean-up of entry l, an entry on
// one of b's sessions, that a Release or an acquisition whose outcome is
// unknown starts (cleanUpEntries).
func CleanUpEntries(b *Backend, l backend.Lease) {
	id, _ := parseToken(l.Token)
	req := backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: l.Key, HolderID: l.HolderID},
		Mode: l.Entry.Mode, Limit: l.Entry.Limit, Ancestors: l.Entry.Ancestors}
	b.cleanUpEntries(req, id, []string{l.Token})
}
