package etcdbackend

// TxnOps exports txnOps to the tests.
var TxnOps = txnOps

// SharedLeases returns the etcd leases b shares between keys: its session
// leases, heartbeat sessions and its release markers' lease. Each lives on until its TTL has
// passed since the last key on it was released (one per TTL and Backend,
// however many keys were used).
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
	b.marker.mu.Lock()
	if b.marker.id != 0 {
		out[int64(b.marker.id)] = true
	}
	b.marker.mu.Unlock()
	return out
}
