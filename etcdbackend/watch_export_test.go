package etcdbackend

// SignalReconnection does what b's connection monitor does when the
// client's connection is ready again after a break: it tells b's watch,
// which sends every subscription a backend.EventReset.
func SignalReconnection(b *Backend) { b.signalReset() }

// Watched reports whether the index of watched Backends holds b.
func Watched(b *Backend) bool {
	hubs.mu.Lock()
	defer hubs.mu.Unlock()
	_, ok := hubs.m[b]
	return ok
}

// WatchedKeys returns the number of keys b's watch has subscriptions for.
func WatchedKeys(b *Backend) int {
	hubs.mu.Lock()
	h := hubs.m[b]
	hubs.mu.Unlock()
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}
