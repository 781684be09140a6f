// Package redisbackend stores Sovereign leases in Redis, through a go-redis
// v9 client: standalone, Sentinel (failover client), Cluster, or one pointed
// at miniredis in tests.
//
// # Operations
//
// Every operation (Acquire, Renew, Release, SetMetadata, Get, Heartbeat,
// Members, RemoveMember, and those of backend.Modes: AcquireMode, Holders,
// CancelWait) is one Lua script, sent with EVALSHA (EVAL once
// after a NOSCRIPT reply): one round trip, atomic, owner-checked where the
// contract says so. Timestamps and ages come from the Redis server's clock
// (TIME), so the clocks of the candidates never matter. Only a lease's own
// TTL, or its owner's Release, ends it: no script deletes a live lease of
// another holder, whatever the heartbeat records say.
//
// List scans (SCAN, never KEYS) every primary for lease hashes whose name
// matches the prefix, then reads each one with the Holders script,
// pipelined: each record is consistent in itself, and records may be read
// at slightly different instants.
//
// # Key layout
//
// With the default prefix "sovereign:" and the key "billing", the keys are,
// all sharing the hash tag {billing} so that every script works on Cluster
// (lock keys differ: see Lock trees and Cluster below):
//
//	sovereign:{billing}                  hash: the lease, with the fields holder, token,
//	                                     term, acquired_at (unix ms), ttl (ms, of the last
//	                                     acquisition or renewal) and one field meta:<name>
//	                                     per metadata entry; PEXPIRE ttl. Absent when
//	                                     nobody holds the key. No renewed_at: see Renewals.
//	sovereign:{billing}:term             string: the fencing term counter. Holds the last
//	                                     term handed out, an integer below 2^53-1 (see
//	                                     Fencing terms). Every Acquire sets its PEXPIRE to
//	                                     Options.TermRetention (1 minute): it survives
//	                                     release and expiry for at most that long.
//	sovereign:{billing}:heartbeat:<id>   hash: fields at (unix ms, when the record was
//	                                     written with this ttl) and ttl (ms, as granted),
//	                                     PEXPIRE ttl; the age is ttl - PTTL (see Heartbeats).
//	sovereign:{billing}:members          set of the IDs that sent heartbeats (an index;
//	                                     Members prunes IDs whose heartbeat has expired);
//	                                     PEXPIRE: until its last heartbeat record expires.
//	sovereign:{billing}:events           pub/sub channel (not a key): "acquired:<term>"
//	                                     and "released:<term>".
//	sovereign:{billing}:renewals         pub/sub channel (not a key): "renewed:<term>:<ttl ms>"
//	                                     (see Watching).
//	sovereign:{billing}:waiters          hash (backend.Modes): the registered waiters,
//	                                     w:<wait ID> = "<seq> <expiry> <x|s>", and the
//	                                     ticket counter seq; PEXPIREAT: its latest
//	                                     waiter's expiry. Absent without waiters.
//
// A key held through backend.Modes keeps its holders (Shared or Exclusive
// entries) and the intents of the locks below it as fields of the lease
// hash, which then has the field modes=1 instead of holder, token and
// term: h:<token> and i:<token>, each with its own expiry by the server's
// clock (see modes.go); the hash expires with its latest entry.
//
// # Lock trees and Cluster
//
// A lock key "lock/<root><rest>" (backend.LockKeyPrefix, a first segment
// root up to the next '/', and rest, empty or beginning with '/') is
// stored as "<prefix>{lock/<root>}{<rest>}", so every key of a tree (lock/a,
// lock/a/b, lock/a/b/c) shares the hash tag {lock/a}: one script takes a
// lock and its intents on every ancestor atomically, on Cluster too. The
// consequence: a tree lives on one Cluster shard (one slot), however many
// locks it holds; spread load over many roots, not many levels. The other
// names of a lock key follow its lease hash as above
// ("sovereign:{lock/a}{/b}:term"). Election keys (which never begin with
// "lock/") keep the plain layout. Versions before this layout stored lock
// keys as "<prefix>{lock/a/b}": a lock held by such a version is not seen
// by this one, so upgrade every process using a lock key at once, or let
// their locks end first.
//
// Inspect them with redis-cli: HGETALL 'sovereign:{billing}', PTTL
// 'sovereign:{billing}', GET 'sovereign:{billing}:term'. A key is written
// as it is, so it must not contain '{' or '}', which would change the hash
// tag (ValidateKey and every method refuse such keys with an error wrapping
// backend.ErrInvalid); '/' and ':' are fine.
//
// Per-key state is bounded in time: the lease hash expires with its TTL
// (with its latest entry's, for backend.Modes), or goes at Release (of its
// last entry), the waiters hash with its latest waiter, each heartbeat
// record with its own TTL, the members set
// when its last heartbeat record does (each Heartbeat extends its expiry to
// cover the record it writes; RemoveMember and Members drop IDs whose record
// is gone, RemoveMember recomputes the expiry from the records left, and
// Redis deletes an empty set; only an instance that shortens its own
// heartbeat TTL can leave the set up to its earlier TTL longer, and a
// leader's renewal that refreshes its record extends the set to twice the
// record's TTL, so the set may outlive the last record by up to one
// heartbeat TTL: see RenewBatch), and the
// term counter TermRetention after the last Acquire (see Fencing terms).
// Once a key is released and its heartbeats have expired, the keyspace is
// back to its size before the key was used, at most TermRetention or one
// heartbeat TTL later, whichever is longer.
//
// # Renewals
//
// A renewal writes nothing but the lease's expiry (PEXPIRE), and the field
// ttl only when it changes the lease's TTL: the time of the last renewal
// is not stored. Record.RenewedAt is derived when the record is read, from
// the expiry that the last acquisition or renewal set to its own time plus
// ttl: RenewedAt = now - (ttl - PTTL), by the server's clock (TIME), which
// gives the time of the last renewal to the millisecond (kept within
// [AcquiredAt, now]); a lease hash left without an expiry (by a PERSIST
// by hand) reads with RenewedAt equal to AcquiredAt. Versions before this one
// wrote a field renewed_at at every acquisition and renewal; a record that
// has it (a lease held by such a version, during a rolling upgrade) is read
// from the field. Those versions read the leases of this one with
// RenewedAt at the Unix epoch (they find no renewed_at), which is
// informational only: nothing in the elector or the lock package uses it.
//
// # Heartbeats
//
// Heartbeat records are kept the same way: a heartbeat (Heartbeat,
// HeartbeatBatch, or a leader's renewal that refreshes its own record)
// sets the record's expiry and writes its fields (at, ttl) only when it
// creates the record or changes its TTL. The age of the last heartbeat is
// ttl - PTTL, and Record.HeartbeatAt and Member.HeartbeatAt are derived as
// now - age by the server's clock; the field at is read only from a record
// without an expiry. Versions before this one wrote at at every heartbeat
// and read it as HeartbeatAt, so they report the time a record of this
// version was created; their ages (ttl - PTTL, what the elector uses) are
// right.
//
// If a key at one of these paths holds something else (a string where the
// lease hash belongs, say), the scripts leave it untouched and the call
// returns an error wrapping ErrWrongType.
//
// # Watching
//
// Backend implements backend.Watcher. All watches of a Backend share one
// pub/sub connection (one per shard on Cluster, where sharded pub/sub,
// SSUBSCRIBE and SPUBLISH, is used by default), opened by the first Watch;
// watching more keys adds channels, not connections. Acquire and Release
// publish on the key's channel, so waiting candidates learn of a release
// within milliseconds; the release of an entry of backend.Modes is
// published on its key's channel and on each of its ancestors', and
// CancelWait publishes a change on the key's channel. Renew and RenewBatch
// publish each renewal ("renewed:<term>:<ttl ms>") on a channel of its
// own, the key's renewals channel (an entry's on its key's and each of
// its ancestors'), to which only WatchRenewals (backend.RenewalWatcher)
// subscribes, and delivers them as EventRenewed; a watch muted with
// WatchRenewalsMuted (backend.RenewalMuter) is not subscribed to it, so a
// leader's own renewals do not come back to it. The elector and the
// lock package's waiters then take the key no sooner than a TTL after the
// last renewal, by their own clocks, even if the server shows it free
// earlier (Redis expires keys by its wall clock, so a step of the server's
// clock forward ends leases early). The expiry of a crashed holder's lease
// is not published (keyspace notifications are not used; the backend never
// runs CONFIG SET): the elector schedules its next attempt from the last
// renewal it heard of, or the TTL the record reports. A pub/sub connection silent for two intervals of
// Options.HealthCheckInterval is broken (an idle one is pinged a little
// before, to tell idle from dead). If it breaks, every watch on it is
// closed at once: when the server restarts (with or without persistence,
// cleanly or after a crash) or the connection is killed, the channels close
// within milliseconds; a server that stops answering without closing the
// connection is noticed when a ping goes unanswered, within two intervals.
// The caller then treats it as a reset (backend.EventReset): it re-reads
// the state, since the server may have lost it, and watches again.
//
// On a Cluster a sharded subscription must be on the master of its slot: a
// replica accepts one and delivers nothing. When a slot moves (a failover,
// a resharding) its old node drops the subscriptions it had (SUNSUBSCRIBE),
// which closes those watches; the next Watch reloads the client's slot map
// first and is refused (the caller watches again) while the map still names
// the node that dropped the slot. Watch also asks a node's role before
// subscribing there (at most once a second per node), and a pub/sub
// connection silent for its health-check period to a node that is no
// longer a master is broken, so a subscription sent to a replica on an out
// of date map is made again on the master.
//
// # Requirements
//
// Redis 5.0 or later (or a compatible server): the scripts read TIME before
// writing, which needs script effects replication, the default since 5.0;
// they also use HSET with several fields (4.0), SET with PX, SCAN and WAIT.
// Entries of backend.Modes expire by TIME: with miniredis, move its clock
// (SetTime) along with FastForward, or they outlive the fast-forward.
// On Cluster the default sharded pub/sub (SPUBLISH, SSUBSCRIBE) needs Redis
// 7.0; with an older Cluster set Options.PubSub to PubSubClassic. The tests
// run against Redis 7.0 and miniredis.
//
// # Cost
//
// Each operation is one EVALSHA. With the elector's defaults (TTL 10 s,
// renewal every 5 s, heartbeat batches every 5 s, records of 15 s
// rewritten every 10 s: see HeartbeatBatch) an idle leader sends about 12
// scripts a minute, its renewals, which also refresh the leader's own
// heartbeat record, so that no heartbeat is left to send (see RenewBatch),
// and an idle follower about 6, its heartbeats: it hears of
// the renewals, so it makes no attempt while they come, and the renewals'
// messages keep the watch connection from falling silent, so it is not
// pinged. A leader does not hear its own renewals (backend.RenewalMuter),
// but the connection stays subscribed to one muted leader's renewals
// channel, its beacon, whose messages it reads and drops: they keep it
// from falling silent too, at one message per renewal interval however
// many elections the process leads (otherwise it is pinged once per 27 s
// of silence).
//
// # Fencing terms
//
// A term is an opaque, increasing integer: compare terms, never do arithmetic
// on them or expect them to count 1, 2, 3. Acquire sets the new term to the
// larger of the key's counter plus one and the Redis server's clock in
// microseconds since 1970 (TIME, seconds*1000000 + microseconds), and stores
// it back in the counter, so terms look like 1763781234567890.
//
// Why terms strictly increase. While the counter exists, each term is above
// the one before it, whatever the clock does. The counter goes away in three
// ways: it expires, TermRetention (default 1 minute) after the last Acquire
// (possibly while the lease is still held, which is harmless: nobody can
// acquire the key before the lease ends); or it is lost with the data (a restart without
// persistence, a failover to a replica that missed it; see Replication). The
// next Acquire then starts from the server's clock, so it suffices that the
// clock has passed every earlier term. Terms do not run ahead of the clock:
// two acquisitions of one key are two script executions, well over a
// microsecond apart (a release or an expiry lies between them), so the clock
// has passed the previous term by the next acquisition and the term is the
// clock's reading. Only a clock stepped back while the counter exists lets
// terms ride the counter ahead of the clock, by at most how far it was
// stepped back. Hence: after an expiry, the next term is above every earlier
// one unless the server's clock was stepped back, in total, by more than
// TermRetention since the counter was created; after a loss of data, unless
// the new server's clock is behind the time of the old one's last
// acquisition (a clock stepped back by more than the downtime, or a replica
// whose clock is behind the old primary's by more than the failover took).
// (Redis also expires the counter by its own wall clock, so a clock stepped
// back after the last acquisition only delays the expiry.) NTP slews small
// offsets and seldom steps a running server's clock by more than a second,
// so neither happens in practice; raise TermRetention if your servers'
// clocks may be stepped back by minutes. A
// Lua number holds these values exactly until 2^53 (the year 2255); the
// scripts write them as decimal strings.
//
// # Replication
//
// Redis replicates asynchronously. If the primary fails after acknowledging an
// acquisition or renewal and before a replica has it, a replica promoted by
// Sentinel or Cluster may not know the lease: another candidate can then
// acquire it while the old leader still believes it leads, until the old
// leader's renew deadline passes. The old leader's writes then carry a lower
// term than the new leader's, so a downstream store that checks fencing terms
// rejects them once the new leader has written: the promoted replica may also
// have missed the term counter, but the new term comes from its clock (see
// Fencing terms). Options.WaitReplicas makes Acquire and Renew wait (WAIT)
// until that many replicas have the write, which narrows the window but, as
// the Redis documentation says, does not make Redis strongly consistent: a
// failover can still pick a replica that missed the write. Count every
// replica: after a promotion the old primary keeps the other replicas until
// Sentinel reconfigures them, so WAIT for fewer can still confirm a write
// that the failover then loses. A restart of a
// server without persistence loses every lease and term counter in the same
// way; terms still increase across it, for the same reason. Options.
// RestartGuard closes that case: the server refuses every free key until it
// has been up for the caller's TTL (Redlock's delayed restart), when every
// lease it could have lost has expired where it was held; it does not see a
// failover, whose new primary has been up all along. When two leaders
// for even a moment are unacceptable and the downstream store cannot check
// fencing terms, use etcd (package etcdbackend).
//
// # Time limits
//
// Every call returns by its context's deadline. A client created with
// ContextTimeoutEnabled: true applies the deadline to the socket itself (the
// recommended setting); with other clients the call stops waiting at the
// deadline and go-redis abandons the request after its own ReadTimeout. A
// *redis.ClusterClient's calls always stop waiting at the deadline too:
// until go-redis has loaded its table of the server's commands, it may
// first wait up to 5 s for a node the call does not need, whatever the
// call's deadline.
package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
)

// Sentinel errors of this package, in addition to those of package backend.
var (
	// ErrWrongType is returned when a key at one of the backend's paths holds
	// data the backend did not write. The data is left untouched.
	ErrWrongType = errors.New("redisbackend: key holds foreign data")

	// ErrNotReplicated is returned by Acquire and Renew, with
	// Options.WaitReplicas set, when fewer replicas than asked confirmed the
	// write within Options.WaitTimeout. Acquire has then released the lease
	// it had just taken on the primary (best effort, within the call's
	// context), so the key is free again.
	ErrNotReplicated = errors.New("redisbackend: write not confirmed by enough replicas")
)

// Client is the part of a go-redis client the backend uses. *redis.Client,
// *redis.ClusterClient, *redis.Ring and every redis.UniversalClient satisfy
// it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// PubSubMode selects the kind of pub/sub used for watch notifications.
type PubSubMode int

const (
	// PubSubAuto uses sharded pub/sub on a *redis.ClusterClient and classic
	// pub/sub otherwise.
	PubSubAuto PubSubMode = iota
	// PubSubClassic uses PUBLISH and SUBSCRIBE (needed on Cluster before
	// Redis 7.0).
	PubSubClassic
	// PubSubSharded uses SPUBLISH and SSUBSCRIBE (Redis 7.0 or later).
	PubSubSharded
	// PubSubOff publishes nothing; Watch returns an error wrapping
	// errors.ErrUnsupported. For stores without pub/sub.
	PubSubOff
)

// Options tune a Backend. The zero value (or nil) means the defaults.
type Options struct {
	// Prefix is prepended to every key and channel name. It must not contain
	// '{' or '}', which would change the hash tag. default: "sovereign:"
	Prefix string

	// WaitReplicas, when positive, makes Acquire and Renew send WAIT in the
	// same round trip and fail with an error wrapping ErrNotReplicated unless
	// at least that many replicas confirm the write. When an acquisition is
	// not confirmed, Acquire releases the lease again (one more round trip,
	// bounded by its context) before returning the error. default: 0 (no
	// WAIT)
	WaitReplicas int

	// WaitTimeout bounds WAIT. Used only with WaitReplicas; it must stay well
	// below the elector's renew deadline. default: 500 milliseconds
	WaitTimeout time.Duration

	// PubSub selects the pub/sub flavour for watch notifications.
	// default: PubSubAuto
	PubSub PubSubMode

	// HealthCheckInterval bounds how long the shared pub/sub connection may
	// stay silent: one that has received nothing for two intervals is
	// broken (its watches are closed). A quiet connection is pinged after
	// two intervals less the ping's answer time, and broken if the answer
	// does not come within that time: a fifth of the interval, at least 1
	// second and at most the interval (3 s of 15 s: pinged after 27 s of
	// silence, about 2 pings a minute). default: 15 seconds
	HealthCheckInterval time.Duration

	// TermRetention is how long a key's term counter is kept after its last
	// Acquire. After that the counter expires and the next term comes from
	// the server's clock, which is above every earlier term unless the clock
	// was stepped back by more than TermRetention (see Fencing terms in the
	// package doc). Longer is safer against clock steps and costs one small
	// string key per key acquired within the window: with many distinct
	// lock keys, about 150 bytes of server memory (measured with 35-byte
	// names) times the keys acquired per TermRetention. default: 1 minute
	TermRetention time.Duration

	// WatchBuffer is the capacity of each watch channel; when it is full,
	// further events are dropped (the buffered ones already tell the
	// receiver to read the state). default: 4
	WatchBuffer int

	// RestartGuard makes the server refuse a free key during its first TTL
	// (the caller's) after it started: Redlock's "delayed restart", done
	// by the store. A server restarted without persistence, or from a
	// snapshot older than a live lease, shows a free key while the lease's
	// holder still holds it until its own deadline. With RestartGuard an
	// acquisition that finds a key free while the server has been up for
	// less than the TTL fails with a *backend.HeldError whose MayBeHeld is
	// set and whose Holder.TTL says how long the refusal lasts (up to the
	// TTL plus a second: the server counts its uptime in whole seconds).
	// That closes the data-loss window for every caller, TryAcquire and a
	// process that never heard from the server included. A reclaim
	// (backend.AcquireRequest.Reclaim: an elector whose renewal found its
	// own lease gone before its deadline) is let through, so an election
	// loses no time. The price: a server that just started hands out no
	// other key for a TTL, so a restart costs a lock a TTL without a
	// holder; and each acquisition of a free key sends LASTSAVE,
	// plus INFO (about 7 µs of server CPU) when the server started or
	// saved less than a TTL ago. The ACL user needs INFO (and LASTSAVE, or
	// every such acquisition sends INFO); without it, or on a server that
	// does not report its uptime (miniredis), acquisitions fail with an
	// error saying so (memorybackend's RestartOptions.Guard simulates the
	// refusal in unit tests). It does not cover a failover to a replica
	// that had not received the lease (WaitReplicas narrows that window).
	// default: false
	RestartGuard bool
}

const (
	defaultPrefix              = "sovereign:"
	defaultWaitTimeout         = 500 * time.Millisecond
	defaultHealthCheckInterval = 15 * time.Second
	defaultWatchBuffer         = 4
	defaultTermRetention       = time.Minute
)

// Backend is a backend.Backend and backend.Watcher on Redis. It is safe for
// concurrent use. Create it with New.
type Backend struct {
	client      Client
	cluster     *redis.ClusterClient // client, when it is a cluster client (for WAIT routing)
	ctxAware    bool                 // client returns by ctx's deadline (a *redis.Client with ContextTimeoutEnabled)
	prefix      string
	waitN       int
	waitTimeout time.Duration
	pubsub      PubSubMode    // PubSubClassic, PubSubSharded or PubSubOff after New
	publishCmd  string        // "PUBLISH", "SPUBLISH" or ""
	healthCheck time.Duration // Options.HealthCheckInterval
	noBeacon    bool          // tests only: no hub keeps a beacon (see hub.beacon)
	pingAnswer  time.Duration // how long a ping of the watch connection may go unanswered (watch.go)
	watchBuffer int
	termKeep    time.Duration // Options.TermRetention
	batch       *batcher      // pipelines concurrent calls on a single server; nil on a cluster client
	// nodeBatches pipelines concurrent calls on a Cluster: one batcher a
	// master (by address, as the client's slot map names it; "" for calls
	// whose master it names none), so that a master that does not answer
	// holds up only the calls of its own keys (see nodeBatcher).
	nodeBatchMu sync.Mutex
	nodeBatches map[string]*batcher

	// publishArg and termKeepArg are publishCmd and termKeep in
	// milliseconds, as script arguments converted to interfaces once;
	// guardArg is "1" with Options.RestartGuard, "" without (see guard).
	publishArg, termKeepArg, guardArg any

	closed atomic.Bool
	hubs   hubs
	noRole atomic.Bool // a Cluster node answered ROLE with an error (ACL): Watch does not ask again (see checkMaster)
	beats  beats       // what HeartbeatBatch last wrote (batchrenew.go)

	lostAcq lostTokens // acquisitions whose reply was lost (lostreply.go)
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Watcher = (*Backend)(nil)
)

// New returns a Backend that uses client. The client stays the caller's:
// Close does not close it. AUTH, TLS, ACL users and timeouts come from the
// client's own options. opts may be nil.
func New(client Client, opts *Options) (*Backend, error) {
	if client == nil {
		return nil, fmt.Errorf("redisbackend: %w: nil client", backend.ErrInvalid)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = defaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("redisbackend: %w: prefix %q contains '{' or '}'", backend.ErrInvalid, o.Prefix)
	}
	if o.WaitReplicas < 0 {
		return nil, fmt.Errorf("redisbackend: %w: WaitReplicas %d is negative", backend.ErrInvalid, o.WaitReplicas)
	}
	if o.WaitTimeout < 0 {
		return nil, fmt.Errorf("redisbackend: %w: WaitTimeout %v is negative", backend.ErrInvalid, o.WaitTimeout)
	}
	if o.WaitTimeout == 0 {
		o.WaitTimeout = defaultWaitTimeout
	}
	if o.WaitTimeout < time.Millisecond {
		return nil, fmt.Errorf("redisbackend: %w: WaitTimeout %v is below 1ms", backend.ErrInvalid, o.WaitTimeout)
	}
	if o.HealthCheckInterval < 0 {
		return nil, fmt.Errorf("redisbackend: %w: HealthCheckInterval %v is negative", backend.ErrInvalid, o.HealthCheckInterval)
	}
	if o.HealthCheckInterval == 0 {
		o.HealthCheckInterval = defaultHealthCheckInterval
	}
	if o.WatchBuffer < 0 {
		return nil, fmt.Errorf("redisbackend: %w: WatchBuffer %d is negative", backend.ErrInvalid, o.WatchBuffer)
	}
	if o.WatchBuffer == 0 {
		o.WatchBuffer = defaultWatchBuffer
	}
	if o.TermRetention < 0 {
		return nil, fmt.Errorf("redisbackend: %w: TermRetention %v is negative", backend.ErrInvalid, o.TermRetention)
	}
	if o.TermRetention == 0 {
		o.TermRetention = defaultTermRetention
	}
	b := &Backend{
		client:      client,
		prefix:      o.Prefix,
		waitN:       o.WaitReplicas,
		waitTimeout: o.WaitTimeout,
		healthCheck: o.HealthCheckInterval,
		pingAnswer:  pingAnswerTime(o.HealthCheckInterval),
		watchBuffer: o.WatchBuffer,
		termKeep:    o.TermRetention,
		guardArg:    "",
	}
	if o.RestartGuard {
		b.guardArg = "1"
	}
	switch c := client.(type) {
	case *redis.Client:
		b.ctxAware = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		// Not ctxAware, whatever its options: until it has its cache of
		// the server's commands, a Cluster client fills it (COMMAND) before
		// every command it routes, from a random node, under a context of
		// its own of 5 s (go-redis#2145): a node that accepts connections
		// but does not answer held a call that does not need it for 5 s
		// past the caller's deadline (TestClusterCallKeepsItsDeadline).
		b.cluster = c
	}
	if b.cluster == nil {
		b.batch = &batcher{client: client, max: 64}
	}
	switch o.PubSub {
	case PubSubAuto:
		b.pubsub = PubSubClassic
		if b.cluster != nil {
			b.pubsub = PubSubSharded
		}
	case PubSubClassic, PubSubSharded, PubSubOff:
		b.pubsub = o.PubSub
	default:
		return nil, fmt.Errorf("redisbackend: %w: unknown PubSub mode %d", backend.ErrInvalid, o.PubSub)
	}
	switch b.pubsub {
	case PubSubClassic:
		b.publishCmd = "PUBLISH"
	case PubSubSharded:
		b.publishCmd = "SPUBLISH"
	}
	b.publishArg, b.termKeepArg = b.publishCmd, ttlMillis(b.termKeep)
	b.hubs.init()
	return b, nil
}

// keyBase returns the lease hash's name of key, which begins every other
// name of key: "<prefix>{<key>}" for an election (any key not beginning
// with backend.LockKeyPrefix), and "<prefix>{lock/<root>}{<rest>}" for a
// lock key "lock/<root><rest>", where root is the first segment after the
// prefix (up to the next '/') and rest is empty or begins with '/'. Every
// key of a lock tree so shares the hash tag {lock/<root>}. Keys contain no
// braces, so the names are unambiguous: an election's name ends at its
// first '}', a lock's at its second, and leaseKeyOf inverts both. key has
// passed ValidateKey.
func (b *Backend) keyBase(key string) string {
	rest, ok := strings.CutPrefix(key, backend.LockKeyPrefix)
	if !ok {
		return b.prefix + "{" + key + "}"
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		i = len(rest)
	}
	return b.prefix + "{" + backend.LockKeyPrefix + rest[:i] + "}{" + rest[i:] + "}"
}

// hashTag returns the hash tag of name: what lies between its first '{'
// and the first '}' after it, as Redis Cluster reads it.
func hashTag(name string) string {
	i := strings.IndexByte(name, '{')
	if i < 0 {
		return name
	}
	j := strings.IndexByte(name[i+1:], '}')
	if j <= 0 {
		return name
	}
	return name[i+1 : i+1+j]
}

func (b *Backend) leaseKeys(key string) (lease, term, hbBase string) {
	base := b.keyBase(key)
	return base, base + ":term", base + ":heartbeat:"
}

// The pub/sub channels of a key: its events (acquisitions, releases,
// changes) and its renewals, the lease hash's name followed by ":events"
// and ":renewals", in the hash's slot (its name has a hash tag), so that a
// script on the hash may SPUBLISH on them.
const (
	eventsSuffix   = ":events"
	renewalsSuffix = ":renewals"
)

func (b *Backend) channel(key string) string         { return b.keyBase(key) + eventsSuffix }
func (b *Backend) renewalsChannel(key string) string { return b.keyBase(key) + renewalsSuffix }

// siblingChannel returns the other channel of channel's key (its renewals
// channel for its events channel, and the reverse), "" for neither.
func siblingChannel(channel string) string {
	if base, ok := strings.CutSuffix(channel, eventsSuffix); ok {
		return base + renewalsSuffix
	}
	if base, ok := strings.CutSuffix(channel, renewalsSuffix); ok {
		return base + eventsSuffix
	}
	return ""
}

// ttlMillis rounds d up to whole milliseconds, Redis's resolution.
func ttlMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func millis(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// begin checks what every call checks first.
func (b *Backend) begin(ctx context.Context) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	return ctx.Err()
}

// beginKey is begin for a call on key: it also checks that key is valid.
func (b *Backend) beginKey(ctx context.Context, key string) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	return b.ValidateKey(key)
}

// bounded runs fn, returning by ctx's deadline even when the client does not
// apply it to the socket: then fn keeps running in the background until
// go-redis gives up, and its result is discarded.
func (b *Backend) bounded(ctx context.Context, fn func(ctx context.Context) error) error {
	if b.ctxAware || ctx.Done() == nil {
		return fn(ctx)
	}
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run evaluates s and returns its reply array. With wait, WAIT follows in
// the same pipeline (one round trip); waitErr is then not nil when the script
// ran but WAIT failed or fewer than Options.WaitReplicas replicas confirmed
// the write (wrapping ErrNotReplicated). err is not nil when the script's
// reply was not received.
func (b *Backend) run(ctx context.Context, s *redis.Script, wait bool, keys []string, args ...any) (reply []any, waitErr, err error) {
	v, waitErr, err := b.runAny(ctx, s, wait, keys, args)
	if err != nil {
		return nil, nil, err
	}
	reply, err = replyArray(v)
	if err != nil {
		return nil, nil, err
	}
	return reply, waitErr, nil
}

// replyArray returns v, a script's reply, as the array every script but
// the successes of Acquire and Release returns.
func replyArray(v any) ([]any, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return nil, fmt.Errorf("redisbackend: unexpected script reply %#v", v)
	}
	return arr, nil
}

// runAny is run returning the script's reply as it came.
func (b *Backend) runAny(ctx context.Context, s *redis.Script, wait bool, keys []string, args []any) (v any, waitErr, err error) {
	if b.ctxAware || ctx.Done() == nil {
		// The common case, on the calling goroutine without a closure.
		return b.eval(ctx, s, wait, keys, args)
	}
	// The closure may still run after bounded returned at ctx's deadline, so
	// it writes only its own variables, read here only after it returned.
	var got any
	var gotWaitErr error
	err = b.bounded(ctx, func(ctx context.Context) error {
		v, werr, err := b.eval(ctx, s, wait, keys, args)
		got, gotWaitErr = v, werr
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return got, gotWaitErr, nil
}

// eval is runAny without the bound on its time.
func (b *Backend) eval(ctx context.Context, s *redis.Script, wait bool, keys []string, args []any) (v any, waitErr, err error) {
	switch {
	case wait:
		v, waitErr, err = b.runWait(ctx, s, keys, args)
	case b.cluster != nil:
		v, err = b.nodeBatcher(ctx, keys).do(ctx, s, keys, args)
	default:
		v, err = b.batch.do(ctx, s, keys, args)
	}
	if err != nil {
		return nil, nil, err
	}
	return v, waitErr, nil
}

// nodeBatcher returns the batcher of the master that serves keys[0] on a
// Cluster, as the client's slot map names it. Its pipelines go through the
// Cluster client, which routes each call by its slot and follows MOVED and
// ASK, so a stale map costs a redirection, never a call: the grouping only
// lets calls to one master share a round trip (100,000 lock acquisitions
// at once take about one pipeline of 64 a master and round trip, not one
// round trip each), and keeps a master that does not answer from holding
// up the pipelines of the others. The callers still wait in Backend.bounded
// (a Cluster client is not bounded by the context).
func (b *Backend) nodeBatcher(ctx context.Context, keys []string) *batcher {
	addr := ""
	if len(keys) > 0 {
		if node, err := b.cluster.MasterForKey(ctx, keys[0]); err == nil {
			addr = node.Options().Addr
		}
	}
	b.nodeBatchMu.Lock()
	defer b.nodeBatchMu.Unlock()
	bt := b.nodeBatches[addr]
	if bt == nil {
		if b.nodeBatches == nil {
			b.nodeBatches = make(map[string]*batcher)
		}
		bt = &batcher{client: b.cluster, max: 64}
		b.nodeBatches[addr] = bt
	}
	return bt
}

// runWait sends EVALSHA and WAIT in one pipeline on the connection that
// serves the key (WAIT counts the replicas that have this connection's
// writes), falling back to EVAL after NOSCRIPT. It returns the script's
// reply, what went wrong with WAIT (see run), and the script's error.
//
// On a Cluster the pipeline goes to the key's master as the client's slot
// map names it, on that node's own client, so the ClusterClient's
// following of redirections does not apply: a MOVED reply (the slot has
// moved: a failover, a resharding; the script did not run) makes the
// client reload its slot map, and the call goes once more, to the master
// the new map names. Without that the client would not learn of the move
// from these calls, which bypass it, and every call would fail with MOVED
// until it reloads its map on its own (ClusterStateReloadInterval, a minute
// by default; TestClusterFailoverKeepsLease). A call that gets no reply
// (the node is down) makes the client reload its map in the background,
// for the caller's next attempt (TestClusterCrashKeepsLease).
func (b *Backend) runWait(ctx context.Context, s *redis.Script, keys []string, args []any) (v any, waitErr, err error) {
	for redirects := 0; ; redirects++ {
		v, waitErr, err := b.runWaitOnce(ctx, s, keys, args)
		if b.cluster == nil || err == nil {
			return v, waitErr, err
		}
		var reply redis.Error
		if !errors.As(err, &reply) {
			// No reply from the node (down, unreachable): the slot map
			// may name a master that is gone. The client reloads it
			// meanwhile, for the caller's next attempt.
			b.cluster.ReloadState(ctx)
			return v, waitErr, err
		}
		if redirects == maxRedirects || !redis.HasErrorPrefix(err, "MOVED") {
			return v, waitErr, err
		}
		if rerr := b.reloadSlots(ctx); rerr != nil {
			return nil, nil, fmt.Errorf("%w (then %w)", err, rerr)
		}
	}
}

// reloadSlots reloads the Cluster client's slot map now (ForEachMaster
// reloads it before it iterates; ReloadState only schedules a reload).
func (b *Backend) reloadSlots(ctx context.Context) error {
	if err := b.cluster.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
		return fmt.Errorf("reload the cluster's slots: %w", err)
	}
	return nil
}

// maxRedirects bounds the MOVED replies runWait follows in one call: a
// node that has not yet learnt of a move may name an old master once more.
const maxRedirects = 2

// runWaitOnce is runWait without following redirections.
func (b *Backend) runWaitOnce(ctx context.Context, s *redis.Script, keys []string, args []any) (v any, waitErr, err error) {
	var p redis.Pipeliner
	if b.cluster != nil {
		node, err := b.cluster.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, nil, err
		}
		p = node.Pipeline()
	} else {
		p = b.client.Pipeline()
	}
	for attempt := 0; ; attempt++ {
		var ev *redis.Cmd
		if attempt == 0 {
			ev = s.EvalSha(ctx, p, keys, args...)
		} else {
			ev = s.Eval(ctx, p, keys, args...)
		}
		w := p.Do(ctx, "wait", b.waitN, b.waitTimeout.Milliseconds())
		_, _ = p.Exec(ctx)
		if attempt == 0 && redis.HasErrorPrefix(ev.Err(), "NOSCRIPT") {
			continue
		}
		v, err := ev.Result()
		if err != nil {
			return nil, nil, err
		}
		n, err := w.Int64()
		switch {
		case err != nil:
			return v, fmt.Errorf("WAIT: %w", err), nil
		case n < int64(b.waitN):
			return v, fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, b.waitN, b.waitTimeout), nil
		}
		return v, nil, nil
	}
}

// checkStatus turns the error statuses every script may return into errors.
func checkStatus(op, key string, reply []any) (string, error) {
	status := str(reply[0])
	if status == "WRONGTYPE" {
		path, found := "", ""
		if len(reply) >= 3 {
			path, found = str(reply[1]), str(reply[2])
		}
		return status, fmt.Errorf("redisbackend: %s %q: %w: %q holds %s; left untouched",
			op, key, ErrWrongType, path, found)
	}
	return status, nil
}

// guard returns the RestartGuard argument of an acquisition: "1" with the
// option, "" without it or for a reclaim (req.Reclaim: the caller's own
// lease was lost, so nobody else's can be).
func (b *Backend) guard(req backend.AcquireRequest) any {
	if req.Reclaim {
		return ""
	}
	return b.guardArg
}

// restartRefusal turns the reply of an acquisition refused under
// Options.RestartGuard (RESTARTED and the milliseconds the refusal lasts,
// or NOINFO and why the server's uptime could not be read) into its error,
// and reports whether the reply was one.
func restartRefusal(key, status string, reply []any) (error, bool) {
	switch status {
	case "RESTARTED":
		ms, ok := reply[len(reply)-1].(int64)
		if len(reply) != 2 || !ok {
			return fmt.Errorf("redisbackend: acquire %q: unexpected reply %#v", key, reply), true
		}
		return &backend.HeldError{Holder: backend.Record{Key: key, TTL: millis(ms)}, MayBeHeld: true}, true
	case "NOINFO":
		return fmt.Errorf("redisbackend: acquire %q: RestartGuard cannot read the server's uptime (INFO server: %s): "+
			"it needs a server that reports uptime_in_seconds (not miniredis) and an ACL user allowed INFO; or turn RestartGuard off",
			key, str(reply[len(reply)-1])), true
	}
	return nil, false
}

// Acquire implements backend.Backend. The lease's TTL is req.TTL rounded up
// to whole milliseconds.
func (b *Backend) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if err := b.begin(ctx); err != nil {
		return backend.Lease{}, err
	}
	if err := req.Validate(); err != nil {
		return backend.Lease{}, err
	}
	if err := b.ValidateKey(req.Key); err != nil {
		return backend.Lease{}, err
	}
	l, err := b.acquire(ctx, req)
	var held *backend.HeldError
	if errors.As(err, &held) && b.reclaimNamed(ctx, req.HolderID, held) {
		// Held by this Backend's own acquisition whose reply was lost,
		// now deleted (see lostreply.go): once more.
		l, err = b.acquire(ctx, req)
	}
	return l, err
}

// acquire is one attempt of Acquire, on a validated request.
func (b *Backend) acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	lease := b.keyBase(req.Key)
	token := backend.NewToken()
	ttl := ttlMillis(req.TTL)
	args := make([]any, 0, 6+2*len(req.Metadata))
	args = append(args, req.HolderID, token, ttl, b.termKeepArg, b.publishArg, b.guard(req))
	for k, v := range req.Metadata {
		args = append(args, k, v)
	}
	v, waitErr, err := b.runAny(ctx, acquireScript, b.waitN > 0, []string{lease, lease + ":term"}, args)
	if err != nil {
		// No reply: the script may still run (see lostreply.go).
		b.lostAcq.remember(req.Key, req.HolderID, token, time.Now())
		return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
	}
	if _, ok := v.(int64); ok { // acquired: the new term
		n, err := parseTerm(v)
		if err != nil {
			return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
		}
		l := backend.Lease{Key: req.Key, HolderID: req.HolderID, Token: token, Term: n, TTL: millis(ttl)}
		if waitErr != nil {
			return backend.Lease{}, b.dropUnreplicated(ctx, l, waitErr)
		}
		return l, nil
	}
	reply, err := replyArray(v)
	if err != nil {
		return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
	}
	status, err := checkStatus("acquire", req.Key, reply)
	if err != nil {
		return backend.Lease{}, err
	}
	if err, ok := restartRefusal(req.Key, status, reply); ok {
		return backend.Lease{}, err
	}
	switch status {
	case "HELD":
		rec, err := parseRecord(req.Key, reply)
		if err != nil {
			return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
		}
		return backend.Lease{}, &backend.HeldError{Holder: rec}
	case "HELDM": // held by entries of AcquireMode
		herr, err := parseHeld(req.Key, reply)
		if err != nil {
			return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
		}
		return backend.Lease{}, herr
	}
	return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: unexpected reply %#v", req.Key, reply)
}

// dropUnreplicated releases l, just acquired on the primary but not
// confirmed by enough replicas (waitErr), so that the caller's next attempt
// does not find its own lease held until the TTL ends. The release is owner
// checked, best effort and bounded by ctx; its failure is reported in the
// message only. The returned error wraps waitErr.
func (b *Backend) dropUnreplicated(ctx context.Context, l backend.Lease, waitErr error) error {
	if err := b.Release(ctx, l); err != nil {
		return fmt.Errorf("redisbackend: acquire %q: %w (term %d left on the primary until its TTL ends: release failed: %v)",
			l.Key, waitErr, l.Term, err)
	}
	return fmt.Errorf("redisbackend: acquire %q: %w (term %d released)", l.Key, waitErr, l.Term)
}

// Renew implements backend.Backend.
func (b *Backend) Renew(ctx context.Context, l backend.Lease) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	if err := b.validateLease(l); err != nil {
		return err
	}
	if l.Entry != nil {
		return b.renewEntry(ctx, l)
	}
	lease := b.keyBase(l.Key)
	reply, waitErr, err := b.run(ctx, renewScript, b.waitN > 0, []string{lease}, l.HolderID, l.Token, ttlMillis(l.TTL), b.publishArg)
	if err != nil {
		return fmt.Errorf("redisbackend: renew %q: %w", l.Key, err)
	}
	status, err := checkStatus("renew", l.Key, reply)
	if err != nil {
		return err
	}
	switch status {
	case "OK":
		if waitErr != nil {
			return fmt.Errorf("redisbackend: renew %q: %w", l.Key, waitErr)
		}
		return nil
	case "LOST":
		return fmt.Errorf("redisbackend: renew %q (term %d): %w", l.Key, l.Term, backend.ErrLeaseLost)
	}
	return fmt.Errorf("redisbackend: renew %q: unexpected reply %#v", l.Key, reply)
}

// Release implements backend.Backend. It publishes a notification for
// watchers in the same script.
func (b *Backend) Release(ctx context.Context, l backend.Lease) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	if err := b.validateLease(l); err != nil {
		return err
	}
	if l.Entry != nil {
		return b.releaseEntry(ctx, l)
	}
	v, _, err := b.runAny(ctx, releaseScript, false, []string{b.keyBase(l.Key)}, []any{l.HolderID, l.Token, b.publishArg})
	if err != nil {
		return fmt.Errorf("redisbackend: release %q: %w", l.Key, err)
	}
	if v == int64(1) { // released
		return nil
	}
	reply, err := replyArray(v)
	if err != nil {
		return fmt.Errorf("redisbackend: release %q: %w", l.Key, err)
	}
	status, err := checkStatus("release", l.Key, reply)
	if err != nil {
		return err
	}
	switch status {
	case "LOST":
		return fmt.Errorf("redisbackend: release %q (term %d): %w", l.Key, l.Term, backend.ErrLeaseLost)
	}
	return fmt.Errorf("redisbackend: release %q: unexpected reply %#v", l.Key, reply)
}

// validateLease checks a lease passed to Renew, Release or SetMetadata.
func (b *Backend) validateLease(l backend.Lease) error {
	if err := l.Validate(); err != nil {
		return err
	}
	return b.ValidateKey(l.Key)
}

// Get implements backend.Backend: one script returns the oldest live
// holder of key (the plain lease, or the entry of AcquireMode with the
// lowest term); intents and waiters are not holders.
func (b *Backend) Get(ctx context.Context, key string) (backend.Record, error) {
	if err := b.beginKey(ctx, key); err != nil {
		return backend.Record{}, err
	}
	recs, err := b.holders(ctx, "get", key, false)
	if err != nil {
		return backend.Record{}, err
	}
	if len(recs) == 0 {
		return backend.Record{}, fmt.Errorf("redisbackend: get %q: %w", key, backend.ErrNotHeld)
	}
	return recs[0], nil
}

// Heartbeat implements backend.Backend. The TTL is rounded up to whole
// milliseconds.
func (b *Backend) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	if err := backend.ValidateHeartbeat(key, id, ttl); err != nil {
		return err
	}
	if err := b.ValidateKey(key); err != nil {
		return err
	}
	_, _, hb := b.leaseKeys(key)
	reply, _, err := b.run(ctx, heartbeatScript, false, []string{hb + id, b.keyBase(key) + ":members"}, id, ttlMillis(ttl))
	if err != nil {
		return fmt.Errorf("redisbackend: heartbeat %q for %q: %w", id, key, err)
	}
	if _, err := checkStatus("heartbeat", key, reply); err != nil {
		return err
	}
	return nil
}

// Members implements backend.Backend. It also drops from the members index
// the IDs whose heartbeat has expired.
func (b *Backend) Members(ctx context.Context, key string) ([]backend.Member, error) {
	if err := b.beginKey(ctx, key); err != nil {
		return nil, err
	}
	_, _, hb := b.leaseKeys(key)
	reply, _, err := b.run(ctx, membersScript, false, []string{b.keyBase(key) + ":members", hb})
	if err != nil {
		return nil, fmt.Errorf("redisbackend: members of %q: %w", key, err)
	}
	if _, err := checkStatus("members", key, reply); err != nil {
		return nil, err
	}
	rest := reply[1:]
	members := make([]backend.Member, 0, len(rest)/4)
	for i := 0; i+3 < len(rest); i += 4 {
		at, ttl, pttl := num(rest[i+1]), num(rest[i+2]), num(rest[i+3])
		if pttl < 0 {
			pttl = 0
		}
		members = append(members, backend.Member{
			ID:          str(rest[i]),
			HeartbeatAt: time.UnixMilli(at),
			Age:         millis(max(0, ttl-pttl)),
			TTL:         millis(pttl),
		})
	}
	slices.SortFunc(members, func(a, b backend.Member) int { return strings.Compare(a.ID, b.ID) })
	return members, nil
}

// RemoveMember implements backend.Backend.
func (b *Backend) RemoveMember(ctx context.Context, key, id string) error {
	if err := b.beginKey(ctx, key); err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("%w: empty instance ID", backend.ErrInvalid)
	}
	_, _, hb := b.leaseKeys(key)
	b.beats.forget(beatKey{key, id}) // the next heartbeat batch writes it again
	reply, _, err := b.run(ctx, removeMemberScript, false, []string{hb + id, b.keyBase(key) + ":members", hb}, id)
	if err != nil {
		return fmt.Errorf("redisbackend: remove member %q of %q: %w", id, key, err)
	}
	if _, err := checkStatus("remove member", key, reply); err != nil {
		return err
	}
	return nil
}

// Close closes the backend's pub/sub connections, which closes every watch
// channel, and waits for the goroutines it started. It does not close the
// client passed to New. Later calls return backend.ErrClosed. Close is
// idempotent and always returns nil.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.hubs.closeAll(b)
	return nil
}

// parseRecord decodes a record reply (see scripts.go) of key.
func parseRecord(key string, reply []any) (backend.Record, error) {
	if len(reply) < 10 {
		return backend.Record{}, fmt.Errorf("short record reply %#v", reply)
	}
	term, err := parseStoredTerm(key, reply[3])
	if err != nil {
		return backend.Record{}, err
	}
	rec := backend.Record{
		Key:        key,
		HolderID:   str(reply[1]),
		Token:      str(reply[2]),
		Term:       term,
		AcquiredAt: time.UnixMilli(num(reply[4])),
		RenewedAt:  time.UnixMilli(num(reply[5])),
		TTL:        millis(max(0, num(reply[6]))),
	}
	if at, ttl, pttl := num(reply[7]), num(reply[8]), num(reply[9]); at >= 0 && pttl >= 0 {
		rec.HeartbeatAt = time.UnixMilli(at)
		rec.HeartbeatAge = millis(max(0, ttl-pttl))
	}
	if meta := reply[10:]; len(meta) >= 2 {
		rec.Metadata = make(map[string]string, len(meta)/2)
		for i := 0; i+1 < len(meta); i += 2 {
			rec.Metadata[str(meta[i])] = str(meta[i+1])
		}
	}
	return rec, nil
}

// parseTerm decodes a term from a script reply: the decimal string the
// script wrote with string.format('%d'), or an integer reply.
func parseTerm(v any) (uint64, error) {
	switch v := v.(type) {
	case string:
		n, err := strconv.ParseUint(v, 10, 64)
		if err == nil && n > 0 {
			return n, nil
		}
	case int64:
		if v > 0 {
			return uint64(v), nil
		}
	}
	return 0, fmt.Errorf("bad term %#v in script reply", v)
}

// parseStoredTerm decodes the term of a stored lease of key, which the
// script read from the store: a term that is not a positive integer was
// written by someone else (by hand, another program), so the error wraps
// ErrWrongType, as for other foreign data at our path.
func parseStoredTerm(key string, v any) (uint64, error) {
	n, err := parseTerm(v)
	if err != nil {
		return 0, fmt.Errorf("%w: the lease of %q has the term %v, not a positive integer; left untouched", ErrWrongType, key, v)
	}
	return n, nil
}

func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

func num(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return -1
		}
		return n
	default:
		return -1
	}
}

// ValidateKey implements backend.Backend. A key must not be empty and must
// not contain '{' or '}': every name of a key is "<prefix>{<key>}..." (of
// a lock key, "<prefix>{lock/<root>}{<rest>}...") so that the hash tag
// keeps all of them in one Cluster slot, and a brace in the key would end
// or change that tag.
func (b *Backend) ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("redisbackend: %w: empty key", backend.ErrInvalid)
	}
	// A loop, not strings.IndexAny, which builds its set of bytes at
	// every call: this runs for every key of every call.
	for i := 0; i < len(key); i++ {
		if key[i] == '{' || key[i] == '}' {
			return fmt.Errorf("redisbackend: %w: key %q contains %q at byte %d, which would break the hash tag {key} that keeps its Redis keys in one Cluster slot",
				backend.ErrInvalid, key, key[i], i)
		}
	}
	return nil
}

// minTTL is the smallest lease TTL the backend honours. A lease must outlast
// a renewal's round trip with room to spare: the elector renews five times
// per TTL and steps down at 7/10 of it, so at 100ms a renewal has 20ms, a
// generous bound for one EVALSHA on a LAN (well under 1ms on loopback) but
// not for a slow link; Redis itself keeps expiry to the millisecond.
const minTTL = 100 * time.Millisecond

// MinTTL implements backend.Backend. It returns 100 milliseconds: below
// that, a renewal's round trip (and a WAIT, with Options.WaitReplicas) takes
// too large a share of the lease. Acquire grants shorter TTLs as asked; the
// elector and the lock package refuse them.
func (b *Backend) MinTTL() time.Duration { return minTTL }

// SetMetadata implements backend.Backend: one owner-checked script replaces
// every metadata field of the lease with md (nil or empty removes them all)
// and leaves its TTL as it is. It publishes nothing.
func (b *Backend) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	if err := b.validateLease(l); err != nil {
		return err
	}
	if l.Entry != nil {
		if err := b.validateEntry(l); err != nil {
			return err
		}
		return b.setEntryMetadata(ctx, l, md)
	}
	lease := b.keyBase(l.Key)
	args := make([]any, 0, 2+2*len(md))
	args = append(args, l.HolderID, l.Token)
	for k, v := range md {
		args = append(args, k, v)
	}
	reply, _, err := b.run(ctx, setMetadataScript, false, []string{lease}, args...)
	if err != nil {
		return fmt.Errorf("redisbackend: set metadata %q: %w", l.Key, err)
	}
	status, err := checkStatus("set metadata", l.Key, reply)
	if err != nil {
		return err
	}
	switch status {
	case "OK":
		return nil
	case "LOST":
		return fmt.Errorf("redisbackend: set metadata %q (term %d): %w", l.Key, l.Term, backend.ErrLeaseLost)
	}
	return fmt.Errorf("redisbackend: set metadata %q: unexpected reply %#v", l.Key, reply)
}
