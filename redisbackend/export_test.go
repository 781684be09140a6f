package redisbackend

// RenewalMessages returns how many renewal messages the pub/sub connections
// of b have received, delivered to a watch or not.
func RenewalMessages(b *Backend) int64 { return b.hubs.renewalMsgs.Load() }

// RenewalsChannel returns the renewals channel of key.
func RenewalsChannel(b *Backend, key string) string { return b.renewalsChannel(key) }

// EventsChannel returns the events channel of key.
func EventsChannel(b *Backend, key string) string { return b.channel(key) }

// NoBeacon makes b's hubs keep no beacon (see hub.beacon), so that every
// muted watch leaves its renewals channel. Call it before b watches.
func NoBeacon(b *Backend) { b.noBeacon = true }
