package etcdbackend

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
