package memorybackend

// KeysHeld returns the number of keys s holds state for, without applying
// any expiry (unlike Len), so that a test can see what the expiry timers
// alone have forgotten.
func KeysHeld(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}
