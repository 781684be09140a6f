package etcdbackend

import "time"

// AgeHostLookups makes every look-up of a session lease's keys that b's
// heartbeat sessions know of (hostLookedUp) look d older than it is.
func AgeHostLookups(b *Backend, d time.Duration) {
	for _, s := range b.hbSessionList() {
		s.hostsMu.Lock()
		for id, at := range s.hosts {
			s.hosts[id] = at.Add(-d)
		}
		s.hostsMu.Unlock()
	}
}
