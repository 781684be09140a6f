package etcdbackend

import "time"

// SetHeartbeatClocks sets the clocks of b's heartbeat session of TTL secs as
// if its lease's last keep-alive had been sent ka ago and its last look-up
// look ago, its previous batch had started gap ago and each of the ones
// before it gap earlier: the next batch, started at once, expects the one
// after it gap later. It reports false when b has no such session.
func SetHeartbeatClocks(b *Backend, secs int64, ka, look, gap time.Duration) bool {
	b.mu.Lock()
	s := b.hbSessions[secs]
	b.mu.Unlock()
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.lastSent, s.lastLook, s.prev = now.Add(-ka), now.Add(-look), now.Add(-gap)
	for i := range s.gaps {
		s.gaps[i] = gap
	}
	return s.id != 0
}

// HeartbeatSessionLease returns the etcd lease of b's heartbeat session of
// TTL secs (0: none).
func HeartbeatSessionLease(b *Backend, secs int64) int64 {
	b.mu.Lock()
	s := b.hbSessions[secs]
	b.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(s.id)
}

// AgeHeartbeats makes every record of b's heartbeat session of TTL secs
// look as if this Backend had last been asked to refresh it d earlier.
func AgeHeartbeats(b *Backend, secs int64, d time.Duration) {
	b.mu.Lock()
	s := b.hbSessions[secs]
	b.mu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, beat := range s.beats {
		beat.at = beat.at.Add(-d)
	}
}
