package etcdbackend

import "time"

// TxnOps exports txnOps to the tests.
var TxnOps = txnOps

// RequestTimeout returns the bound b puts on each call.
func RequestTimeout(b *Backend) time.Duration { return b.timeout }

// SharedLeases returns the etcd leases b shares between keys: its session
// leases and heartbeat sessions. Each lives on until its TTL has passed
// since the last key on it was released (one per TTL and Backend, however
// many keys were used).
func SharedLeases(b *Backend) map[int64]bool {
	out := make(map[int64]bool)
	for _, s := range b.sessionList() {
		s.mu.Lock()
		if s.id != 0 {
			out[int64(s.id)] = true
		}
		s.mu.Unlock()
	}
	b.mu.Lock()
	hbs := make([]*hbSession, 0, len(b.hbSessions))
	for _, s := range b.hbSessions {
		hbs = append(hbs, s)
	}
	b.mu.Unlock()
	for _, s := range hbs {
		s.mu.Lock()
		if s.id != 0 {
			out[int64(s.id)] = true
		}
		s.mu.Unlock()
	}
	return out
}

// SessionHeadroom returns the headroom of the session of TTL ttl (in whole
// seconds, rounded up), as a duration.
func SessionHeadroom(ttl time.Duration) time.Duration {
	secs, err := ttlSeconds(ttl)
	if err != nil {
		panic(err)
	}
	return time.Duration(sessionHeadroom(secs)) * time.Second
}

// AgeSessions makes every session lease of b look d older than it is, by
// moving back the send time of its last grant or keep-alive: the next
// acquisition then sees what it would see d later, without waiting.
func AgeSessions(b *Backend, d time.Duration) {
	for _, s := range b.sessionList() {
		s.mu.Lock()
		s.lastSent = s.lastSent.Add(-d)
		s.mu.Unlock()
	}
}

// LeaseOfToken returns the etcd lease ID in a token of b's.
func LeaseOfToken(token string) int64 {
	id, _ := parseToken(token)
	return int64(id)
}
