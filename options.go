package sovereign

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sovereign-go/sovereign/internal/keeper"
)

// ErrInvalidOptions is wrapped by every error New returns for a bad argument
// or option.
var ErrInvalidOptions = errors.New("sovereign: invalid options")

// Default values of Options. Durations other than TTL are derived from the
// TTL in use, so setting only TTL keeps every ratio below.
const (
	// DefaultTTL is the default lease time to live.
	DefaultTTL = 10 * time.Second
	// DefaultStartupJitter is the default maximum random delay before the
	// first campaign.
	DefaultStartupJitter = 250 * time.Millisecond
	// heartbeatTTLExtra is added to TTL for the default HeartbeatTTL, as in
	// the Sovereign design (leader TTL + 5 s).
	heartbeatTTLExtra = 5 * time.Second
	// minInterval is the shortest RenewInterval and RequestTimeout accepted:
	// below it an elector spends its time on timers, not on leading.
	minInterval = 100 * time.Microsecond
)

// Options configure an Elector. A nil *Options means every default. Zero
// fields take their defaults; New validates the result and returns an error
// wrapping ErrInvalidOptions when it is inconsistent.
type Options struct {
	// TTL is the lease time to live requested from the backend: how long the
	// lease outlives a leader that stops renewing, and so roughly how long a
	// crashed leader's successor waits.
	// Default: DefaultTTL (10 s).
	TTL time.Duration

	// RenewDeadline is how long a leader keeps leading after it *sent* the
	// last acquire or renew that succeeded. Past it the leader
	// steps down by itself (leader context cancelled, IsLeader false), even
	// if the process was paused and no goroutine ran. TTL - RenewDeadline is
	// the safety margin that absorbs clock-rate drift between this process
	// and the backend. Must be less than TTL.
	// Default: 7/10 of TTL (7 s).
	RenewDeadline time.Duration

	// RenewInterval is how often the leader renews its lease. Must be less
	// than RenewDeadline. A failed renewal is retried a quarter of it
	// after the failed attempt was sent, or at once when the attempt failed
	// later than that; each periodic attempt waits for its reply at most
	// RequestTimeout, and no longer than leaves a quarter interval for one
	// more attempt before RenewDeadline (never less than a quarter
	// interval). So a renewal that times out is retried before
	// RenewDeadline whenever RenewInterval*5/4 < RenewDeadline; New logs a
	// warning when it is not.
	// Default: 1/2 of TTL (5 s; at most 5/7 of a RenewDeadline set
	// shorter than 7/10 of TTL), the cadence of Consul's session renewal
	// and what an etcd session's 500 ms tick makes of its TTL/3 at TTL 2 s:
	// a renewal at TTL/2 waits up to 0.125 TTL (1.25 s) for its reply, and
	// a retry then has until 0.7 TTL. A shorter interval costs more
	// requests (TTL/3: half as many again) and leaves longer for each
	// attempt.
	RenewInterval time.Duration

	// RequestTimeout bounds every backend call. A leader's calls are also cut
	// at its renew deadline, so a hung backend never delays a step-down. Must
	// be less than RenewDeadline.
	// Default: 1/5 of TTL (2 s), at most RenewInterval.
	RequestTimeout time.Duration

	// HeartbeatInterval is how often every instance, leader or not, refreshes
	// its heartbeat record. Must be less than HeartbeatTTL. A backend may
	// skip the write of a record that outlives the next refresh with time to
	// spare: redisbackend rewrites it only when it would otherwise have a
	// quarter of HeartbeatTTL or less left at the next one, so with the
	// defaults a follower's record is written every 10 s and the heartbeat
	// age that Leader, Members and `sovereign status` show reaches 10 s.
	// Default: 1/2 of TTL (5 s).
	HeartbeatInterval time.Duration

	// HeartbeatTTL is the lifetime of a heartbeat record. Heartbeats are
	// information: Members lists them, Leader shows the holder's last one,
	// and a follower that finds the leader's record missing for longer than
	// HeartbeatTTL publishes LeaderStale. They never end a lease: only the
	// lease's TTL does, since a record also vanishes while its owner lives
	// (a store that lost data, an eviction, a same-ID instance stopping). A
	// leader whose heartbeats fail reports it (ElectionFailed) and keeps
	// leading while its renewals succeed.
	// Default: TTL + 5 s.
	HeartbeatTTL time.Duration

	// StartupJitter is the maximum random delay before the first campaign, so
	// a fleet restarted at once does not stampede the backend. Must not be
	// negative.
	// Default: DefaultStartupJitter (250 ms) unless NoStartupJitter is set.
	StartupJitter time.Duration

	// NoStartupJitter disables the startup jitter.
	NoStartupJitter bool

	// ResignSitOut is how long an elector that resigned waits before it
	// campaigns again, so that another candidate takes over.
	// Default: 1/5 of TTL (2 s), at most RenewInterval.
	ResignSitOut time.Duration

	// Metadata is stored with the lease and shown to anyone who reads the
	// leader's record (hostname, version, ...).
	Metadata map[string]string

	// Metrics receives the elector's measurements (see Metrics; the
	// contrib/prometheus module adapts it to Prometheus). Default: none.
	Metrics Metrics

	// Logger receives the elector's logs: transitions at Info, failures at
	// Warn. Default: slog.Default().
	Logger *slog.Logger
}

// withDefaults returns a copy of o (which may be nil) with defaults applied,
// validated.
func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	neg := func(name string, d time.Duration) error {
		if d < 0 {
			return fmt.Errorf("%w: %s is negative (%v)", ErrInvalidOptions, name, d)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"TTL", r.TTL}, {"RenewDeadline", r.RenewDeadline}, {"RenewInterval", r.RenewInterval},
		{"RequestTimeout", r.RequestTimeout}, {"HeartbeatInterval", r.HeartbeatInterval},
		{"HeartbeatTTL", r.HeartbeatTTL}, {"StartupJitter", r.StartupJitter}, {"ResignSitOut", r.ResignSitOut},
	} {
		if err := neg(f.name, f.d); err != nil {
			return r, err
		}
	}
	if r.TTL == 0 {
		r.TTL = DefaultTTL
	}
	if r.RenewDeadline == 0 {
		r.RenewDeadline = r.TTL * 7 / 10
	}
	if r.RenewInterval == 0 {
		r.RenewInterval = keeper.DefaultRenewInterval(r.TTL, r.RenewDeadline)
	}
	if r.RequestTimeout == 0 {
		r.RequestTimeout = min(r.TTL/5, r.RenewInterval)
	}
	if r.HeartbeatInterval == 0 {
		r.HeartbeatInterval = r.TTL / 2
	}
	if r.HeartbeatTTL == 0 {
		r.HeartbeatTTL = r.TTL + heartbeatTTLExtra
	}
	if r.StartupJitter == 0 && !r.NoStartupJitter {
		r.StartupJitter = DefaultStartupJitter
	}
	if r.NoStartupJitter {
		r.StartupJitter = 0
	}
	if r.ResignSitOut == 0 {
		r.ResignSitOut = min(r.TTL/5, r.RenewInterval)
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	switch {
	case r.RenewDeadline >= r.TTL:
		return r, fmt.Errorf("%w: RenewDeadline (%v) must be less than TTL (%v)", ErrInvalidOptions, r.RenewDeadline, r.TTL)
	case r.RenewInterval >= r.RenewDeadline:
		return r, fmt.Errorf("%w: RenewInterval (%v) must be less than RenewDeadline (%v)", ErrInvalidOptions, r.RenewInterval, r.RenewDeadline)
	case r.RequestTimeout >= r.RenewDeadline:
		return r, fmt.Errorf("%w: RequestTimeout (%v) must be less than RenewDeadline (%v)", ErrInvalidOptions, r.RequestTimeout, r.RenewDeadline)
	case r.HeartbeatInterval >= r.HeartbeatTTL:
		return r, fmt.Errorf("%w: HeartbeatInterval (%v) must be less than HeartbeatTTL (%v)",
			ErrInvalidOptions, r.HeartbeatInterval, r.HeartbeatTTL)
	case r.RenewInterval < minInterval:
		return r, fmt.Errorf("%w: RenewInterval (%v) must be at least %v (TTL %v is too short)",
			ErrInvalidOptions, r.RenewInterval, minInterval, r.TTL)
	case r.RequestTimeout < minInterval:
		return r, fmt.Errorf("%w: RequestTimeout (%v) must be at least %v", ErrInvalidOptions, r.RequestTimeout, minInterval)
	}
	return r, nil
}
