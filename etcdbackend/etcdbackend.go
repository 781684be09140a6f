// Package etcdbackend implements backend.Backend and backend.Watcher on etcd,
// through the user's own etcd client v3 (go.etcd.io/etcd/client/v3), so TLS,
// authentication and endpoints stay the user's.
//
// etcd is the store to choose when leases must survive the loss of a node:
// every write is replicated by raft before it is acknowledged, and reads are
// linearizable.
//
//	cli, _ := clientv3.New(etcdbackend.ClientConfig("127.0.0.1:2379"))
//	defer cli.Close()
//	b, _ := etcdbackend.New(cli, nil) // keys under "sovereign/"
//	defer b.Close()                   // does not close cli
//	e, _ := sovereign.New(b, "scheduler", id, nil) // id: unique per replica
//
// # How leases map onto etcd
//
// Acquisitions share a session, as etcd's concurrency.Session does: each
// Backend keeps one etcd lease per TTL (in whole seconds) and per 2,048
// keys, granted on first use and granted again once it is lost (a full
// session lease keeps its keys and is renewed as before; later acquisitions
// of that TTL go on a new one, so that no renewal looks up more than about
// 2,048 keys), and Acquire attaches the key to it (AcquireMode its entries, intents and waiter registrations: see
// below). Acquire is one transaction that compares the key's create revision
// with 0 and puts the record under <prefix><key> attached to the session
// lease. A key on a session ends when the session lease does, at the
// receipt of its last grant or keep-alive plus its TTL, so at least that
// TTL after the send time of that request. The session lease of a TTL of 8
// s or more is granted up to 1/8 longer than asked, in whole seconds (8 s
// gets 9 s, 10 s gets 11 s, 16 s gets 18 s; below 8 s, no headroom):
// while it was kept alive less than that headroom before an acquisition
// was sent, the transaction is all, and the key lasts at least the TTL
// asked for from the send time (Lease.TTL says how long: what the session
// has left, up to its granted TTL). Otherwise a keep-alive of the session
// goes with the transaction (sent with it, after the send time: no round
// trip added), so the key lasts the session's TTL from the send time; when
// it fails, the acquisition gives the key up and fails. A burst of
// acquisitions thus sends one keep-alive per headroom, not one each; a key
// whose holder stopped renewing it lasts up to the headroom longer than
// the TTL asked for (its Lease.TTL shows it). A request with
// backend.AcquireRequest.Detached gets an etcd lease of its own, granted for
// it and revoked by its Release (the package lock asks for one for NoRenew
// and MaxHold locks: a session kept alive by other holds would keep such a
// lock alive past its TTL). Entries of backend.Modes ride on the session
// of their TTL like plain keys, unless Detached, and so do waiter
// registrations (see below).
//
// # Sessions: why renewing one key renews them all, and why that is safe
//
// A keep-alive of a session lease extends every key on it, not only the one
// being renewed. That is safe because every key on a session belongs to a
// hold that is being renewed: the lease keeper renews each of its leases
// until its Release, also after a step-down, and retries a failed Release;
// a hold that stops renewing before its release (NoRenew, MaxHold) asks for
// a Detached lease. So no key on a session outlives the renewals of its own
// holder by more than the TTL, as with a lease of its own; each holder's
// deadline still counts from the send time of its own renewal (package
// internal/keeper), and a renewal still checks its own key (below), so
// losing one key never keeps or drops another. The same holds for an entry
// of backend.Modes (a holder and its intents on its ancestors, renewed and
// released together, checked together). A waiter registration is not a
// hold: its waiter refreshes it by trying again (package lock, every third
// of the TTL at least) and withdraws it with CancelWait; the Backend that
// made it remembers when it ends (its TTL from the send time of its last
// refresh) and deletes it then, owner-checked by its etcd lease and by
// the mod revision of its last put here, if nothing refreshed or withdrew
// it first (a failed delete is tried again each second); a retry whose
// read-only probe ran while such a delete was under way puts the
// registration again rather than trust the read, and that put keeps it
// from the delete. So while its Backend runs, a registration outlives its TTL
// by the time that delete takes; when its process dies, it ends with the
// session, at most the session's TTL (the TTL plus its headroom) after the
// session's last keep-alive, which the process's other holds may have sent
// after the waiter's last refresh: it then outlives its TTL by at most the
// headroom plus the time from its last refresh to the process's end (for
// package lock's waiters, a third of the TTL). An acquisition whose
// outcome is unknown (a timeout) may have put a key on the session that
// nobody will renew or release, and a Release that failed leaves its key
// there while its caller may give up on it (the elector does, after a
// failed verification): the Backend deletes such a key in the background,
// owner-checked by its token, retrying until done (after pauses of 1 s
// doubling up to 8 s, each a random point of the upper half of its bound,
// so that the clean-ups of an outage do not come back as a herd), until the
// session lease has gone, or until Close. An acquisition whose caller gave
// up after its transaction was sent may still commit after that clean-up
// found nothing to delete: RenewBatch, which reads the keys attached to
// the session anyway, deletes every key on it that this Backend neither
// holds nor is acquiring (created at or before that read, and still on the
// session; an entry's keys, its intents and this Backend's live
// registrations count as held, and an acquisition in flight protects the
// keys of its key and of its ancestors). A caller that drops a lease
// without releasing it, and without stopping its renewals, would keep its
// key alive as long as the session lives; the lease keeper never does.
//
// Backend implements backend.AcquireConfirmer: Acquire's reply is that of
// the transaction that compared the key free and wrote the record,
// committed through raft as one step, so the elector's double verification
// checks that reply instead of reading the key back (a linearizable read
// right after it would return the same record).
//
// When the session lease is lost (it expired while the store was
// unreachable, or etcd restarted without its data), every key on it is
// lost, entries and registrations included: Renew and RenewBatch report
// backend.ErrLeaseLost for each, and the next acquisition grants a new
// session (an acquisition, plain or AcquireMode, whose transaction finds
// the lease gone is retried once on a new one).
//
// RenewBatch (backend.BatchRenewer) renews the leases of each session lease
// in the batch with two requests sent together, however many they are (the
// sessions of a batch concurrently): a keep-alive of the session lease, and
// a look-up of the keys attached to it (TimeToLive with
// its keys, no raft write). While the Backend's watch is up (any Watch of
// it, an elector's or a Locker's, keeps one) and has delivered no change
// that the look-up could see differently from what this Backend knows
// since the last one (a key held here deleted or put on another lease, a
// key it does not hold put on a session lease it holds keys on, a
// heartbeat record changed), the keep-alive goes alone: an idle holder
// renews with one request, as a concurrency.Session does. A look-up sent
// before a change did not see it either, so the owner check finds a key
// deleted by hand as soon as before: at the first renewal after the watch
// delivered the deletion. A lease is renewed when its key is attached to
// the session and this Backend attached it with that lease's token and has
// neither released it nor found it lost since; otherwise it alone is lost
// (deleted by hand, taken by another holder, or acquired again here after
// that). This is an owner check by token: only this Backend attaches keys
// to its session leases, and it records the token of each key it attaches,
// so a key attached to the session holds the record it wrote last. An
// entry of backend.Modes on a session is checked the same way, its holder
// key and each of its intents: it is lost when any of them is. Other
// leases in a batch (Detached, a session of another Backend) are renewed
// one by one with Renew, 16 at a time.
//
// Release of a lease on a session is one owner-checked transaction that
// deletes the record and writes nothing else: watchers tell it from an
// expiry by lease marks (see Watch). The session lease stays, for the next
// acquisition; once no key is on it and nothing renews it, it ends at its
// TTL.
//
// Every etcd lease that holds records or entries carries a lease mark,
// <prefix>\x00lease/<lease ID in hex>, an empty value attached to it, put
// by the transaction that attaches the first record or entry to it (on a
// session lease, every acquisition's transaction puts it too until one of
// them has succeeded: no request of its own; a waiter registration needs
// none, its deletion being reported alike whatever its cause). When the
// lease ends (its TTL passed, or it was revoked), etcd deletes every key on
// it in one revision, the mark with them, so a deletion of a record or
// entry whose revision deletes a lease mark is an expiry, and any other one
// a release. A mark lives exactly as
// long as its lease, one per lease however many keys ride on it, and is no
// key's (a key never contains NUL). A lease granted by a version of this
// package without lease marks has none: its expiry is reported as a
// release, which the elector and package lock treat alike.
//
// etcd counts lease TTLs in whole seconds: a TTL that is not a whole number
// of seconds is rounded up (1.2 s becomes 2 s, 1 ns becomes 1 s), for leases
// and heartbeats alike, never down, so a lease never ends earlier than asked.
// etcd then raises any TTL below its own minimum to that minimum, which the
// server derives from its raft timing: 1.5 election timeouts, rounded up to
// whole seconds. With etcd's default timing (election timeout 1000 ms) that
// is 2 s; with an election timeout of 666 ms or less it is 1 s, the least
// etcd ever grants, which is what MinTTL reports (the backend cannot learn
// the server's timing without I/O). Lease.TTL reports the TTL etcd actually
// granted. A longer grant than requested is safe: the elector steps down by
// its own RenewDeadline, counted from its requests, so only a crashed
// leader's lease outlives it longer. To fail over within a TTL of 1 s, run
// etcd with --election-timeout of at most 666 ms.
//
// The fencing term is the key's create revision: etcd revisions only go up,
// across the whole cluster, so every acquisition of a key (after a release or
// an expiry) gets a strictly greater term, and terms of different keys are
// ordered too. Nothing outlives a lease to keep terms increasing: the
// cluster's revision counter does that, so a key's state is gone once its
// lease and its heartbeats have ended. Terms increase as long as the cluster
// keeps its data: a member restored from an empty or older data directory
// starts revisions over, and terms with them (restore snapshots with "etcdutl
// snapshot restore --bump-revision" to keep them increasing); raft
// replication makes such a loss a disaster, not a failover.
//
// Requests per operation on a session (TestRoundTrips, TestSession,
// TestPairRequests): Acquire 1 round trip: the transaction, with a
// keep-alive of the session sent with it when the session has less than
// the TTL asked for left (2 requests); the first acquisition of a TTL adds
// the grant of its session. An Acquire and
// Release pair on a warm session is two transactions, as etcd's
// concurrency.Mutex TryLock and Unlock are two requests. Keep-alives of
// session leases, Detached leases and waiter registrations are messages on
// one lease keep-alive stream per Backend, opened by the first and opened
// again after it broke (clientv3's KeepAliveOnce opens a gRPC stream for
// each keep-alive, three times the cost of the keep-alive itself).
// A failed Acquire adds two lease look-ups (the holder's remaining TTL and
// heartbeat age), run in parallel. Once an Acquire has found a key held,
// the next Acquire of that key by the same Backend first probes with a
// read-only transaction (no raft writes, no keep-alive) unless one of its
// watches has seen the key deleted since; a waiting follower's periodic
// attempt thus costs 3 requests and no writes. Renew 1 round trip: an
// owner-checked read-only transaction and a keep-alive of the session, sent
// together (the keep-alive extends only this Backend's own session, so it
// needs no check first); RenewBatch 2 requests per session, as above;
// Release 1 (the owner-checked transaction, deleting the record alone);
// SetMetadata 1 (an owner-checked transaction that
// rewrites the record with the same etcd lease attached; the token carries
// the acquisition time, so no read is needed); Get 1 read plus 2 parallel
// lease look-ups; List 1 range read plus one lease look-up per held key,
// 16 at a time (etcd has no batched TimeToLive; List's records carry no
// heartbeat fields, Get's do). A Detached lease: Acquire 2 (grant,
// transaction; a failure adds the revocation of the grant), Renew 2 (an
// owner-checked read-only transaction, then a keep-alive of its lease, in
// this order), Release 2 (an owner-checked delete, then revoking the
// lease).
//
// A lease token is "<etcd lease ID>-<acquisition time in Unix
// nanoseconds>-<random part>", in hex, the random part 128 random bits,
// preceded by "s" for a lease on a session. The record's value starts with
// a header line holding the token and the holder ID, followed by a JSON
// object with the acquisition time and metadata, so Renew, Release and
// SetMetadata check the exact lease (create revision, attached etcd lease,
// token and holder ID) inside one transaction; for a lease on a session,
// Renew and Release compare the token and holder ID alone, which imply the
// rest (only this lease's acquisition writes a record with its token) and
// spare the server two reads of the key. Only the etcd lease's own
// TTL, or its owner's release, ends a lease: no call of this package
// deletes another holder's record.
//
// # Shared locks, semaphores, hierarchies and fair queueing
//
// Backend implements backend.Modes in full. Next to a key's lease record
// <prefix><key>, its entries live under <prefix><key>\x00 (NUL is forbidden
// in keys, so this never collides with a user key, a descendant
// "<key>/..." or a heartbeat record):
//
//	<prefix><key>\x00                     release marker (written by earlier versions only)
//	<prefix><key>\x00hx/<token>           an Exclusive holder
//	<prefix><key>\x00hs/<limit>/<token>   a Shared holder without a limit (limit 00000000)
//	<prefix><key>\x00hs/<limit>/<slot>    a Shared holder of a semaphore: slot 0 to limit-1
//	<prefix><key>\x00ix/<token>           intent of an Exclusive lock below
//	<prefix><key>\x00is/<token>           intent of a Shared lock below
//	<prefix><key>\x00wx/<wait ID>         a waiter in Exclusive mode
//	<prefix><key>\x00ws/<wait ID>         a waiter in Shared mode (Fair only)
//
// (limits and slots in 8 hex digits). A holder and its intents on its
// ancestors are attached to the session lease of the TTL asked for (see
// "Sessions"; the token says so, as a plain key's does), so they are
// renewed and expire with it and are released together; a Detached
// request gets an etcd lease of its own for them, granted for it and
// revoked by its Release (package lock asks for one for NoRenew and
// MaxHold locks). A holder's
// record and its intents carry the token, holder ID, acquisition time,
// metadata, mode and limit (an intent also the key of its lock), so a
// conflict with an intent names the lock below. The term of an entry is its
// holder key's create revision, from the cluster's one revision counter,
// which plain Acquire shares: terms increase strictly across every mode.
//
// AcquireMode is one transaction whose comparisons are the conflicts of the
// backend.Modes contract, each a range comparison "create revision = 0"
// (etcd compares every key of a range, and an empty range as a key with
// revision 0, so this holds exactly while the range is empty): no lease
// record; no holder (Exclusive) or no Exclusive holder and no Shared holder
// of another limit (Shared, a mismatch being told apart from the reads of
// the failure branch, and writing nothing); no intent (Exclusive) or no
// intent of an Exclusive lock (Shared); on each ancestor no lease record, no
// Exclusive holder and, for an Exclusive lock, no Shared holder. Writer
// preference: a Shared acquisition that is not Fair also needs the
// Exclusive waiters' range empty; a hierarchical acquisition that is not
// Fair, in either mode, needs each ancestor's Exclusive waiters' range
// empty (ModeSupport.AncestorWaiters: a stream of locks below cannot
// starve an Exclusive lock above), and the failure branch counts them, so
// that a HeldError caused by them alone names the ancestor. A Shared acquisition with a limit takes
// the first free slot through a chain of nested transactions, one level per
// slot, so the limit costs no extra request. etcd counts the operations of
// a transaction along its deepest nesting against --max-txn-ops (128 by
// default), hence MaxLimit (64), and a bound on ancestors that shrinks as
// the limit grows (41 for an Exclusive lock, 40 for a Shared one, 9 for a
// semaphore of 64; Fair with a WaitID, which does not compare the
// ancestors' waiters, 61, 59, and 28 for a semaphore of 3 and 13 for one
// of 64: TestModesLargestTransactions); a larger request fails with
// backend.ErrUnsupported before any request is made.
// A semaphore's transaction carries the holder's record (metadata
// included) once per slot and ancestor, and etcd refuses a request above
// --max-request-bytes (1.5 MiB by default): keep a semaphore's metadata
// small. Plain Acquire's transaction compares the holder and
// intent ranges too, and its HeldError names the oldest entry; Get returns
// the oldest holder, List one record per holder (never an intent, a waiter
// or an entry's etcd key), Holders every holder in term order.
//
// Fair order is revision order. A waiter is registered, in the failure
// branch of its acquisition's transaction, on the session lease of its TTL
// (a Detached request's too), and the Backend remembers the registration's
// create revision, and when it ends (see "Sessions"). A Fair retry then
// compares that its own key still has that create revision and that every
// waiter's create revision is at least it ("> rev-1": etcd has no ">="),
// so nobody registered before it; with no registration, the waiters' range
// must be empty. A retry that finds the key still held refreshes the
// registration without a write: the read-only probe sees it still attached
// to the session (with a keep-alive of the session sent along when the
// session has less than the TTL left), and the Backend moves its end; a
// success deletes it, in either mode, in its transaction. A registration
// whose WaitID comes back in the other mode is replaced in the same
// transaction. A retry of a registration made by another Backend fails once,
// learning its place from the failure branch's reads, and is tried again
// at once with it: one more transaction, only then. A waiter's put and its
// refreshes send no watch event (each would wake every waiter, whose retry
// would wake them again); its deletion (success, CancelWait, expiry) sends
// backend.EventChanged.
//
// Release of an entry deletes it and its intents, and nothing else, in one
// owner-checked transaction: its revision deletes no lease mark, so
// watchers of the key and of every ancestor see backend.EventReleased
// (an expiry, which deletes the lease mark of the entry's etcd lease in
// the same revision: backend.EventExpired). A Detached entry's lease is
// then revoked. Nothing of an entry outlives its lease, a registration is
// deleted when it is withdrawn, replaced or due, and a session lease holds
// nothing once its keys are gone, so the store returns to its size before
// once every entry is released or has expired (the session leases, one per
// TTL and Backend, end at their TTL once unused).
//
// Requests (raft proposals) per operation, measured by TestModesRoundTrips,
// on a session already granted (the first use of a TTL adds its grant, and
// a keep-alive of the session goes with the transaction, sent with it,
// when the session has less than the TTL left, as for Acquire): AcquireMode
// of a free key in any mode, with or without a limit or ancestors, by a
// registered waiter or not, 1 (1: the transaction); a failed first attempt
// 1 (1), whether it registers a waiter or not. Once an attempt has found
// the key held (and no watch of this Backend has seen a holder go since),
// a retry first probes with a read-only transaction of the same
// comparisons: a failed retry costs 1 (0), a registered waiter's included
// (it refreshes the registration), and a retry that finds the key free one
// request (no proposal) more than above. Every failure adds one lease
// look-up per conflicting holder (no proposal), in parallel. Renew 1 round
// trip (0: a read-only transaction checking the entry and its intents, and
// a keep-alive of the session, sent together); RenewBatch 2 requests per
// session however many entries and plain keys ride on it (0: the session's
// keep-alive and look-up), 1 while the watch covers the look-up (see
// above); Release 1 (1: the transaction); SetMetadata 1
// (1); CancelWait 1 (1),
// whoever made the registration; Holders 1 range read plus a look-up per
// holder (0); Get 1 plus 1 or 2 look-ups (0). A Detached entry: AcquireMode
// 2 (2: grant, transaction; a failure without a probe adds the revocation
// of the grant), Renew 2 (0: read-only transaction, then keep-alive of its
// lease), Release 2 (2: transaction, revocation).
//
// # Heartbeats
//
// Heartbeat records live under <prefix><key>/heartbeat/<id>. Those written
// by HeartbeatBatch (backend.BatchHeartbeater, which the elector uses) share
// a heartbeat session: one etcd lease per Backend and heartbeat TTL, kept
// alive only when it would otherwise have less than a quarter of its TTL
// left at the next batch, and whose keys are looked up about once per TTL
// (records found missing are rewritten), whatever the number of records; a
// leader's records ride on the session lease its renewals keep alive and
// look up (see HeartbeatBatch); a record the Backend stops
// refreshing is deleted by a later batch once a TTL has passed, or ends
// with the session. RemoveMember does not revoke a session's lease (other
// records are on it). A record written by Heartbeat is attached to its own
// lease with the heartbeat TTL (rounded up to whole seconds). The
// backend keeps that lease per (key, id) and refreshes it with a keep-alive,
// which etcd's leader serves without a raft write, while a read-only
// transaction (no raft write either) checks that the record is still there
// and attached to that lease: a record deleted by hand, or overwritten and
// attached to another lease, leaves the lease alive, so a successful
// keep-alive alone proves nothing. A missing or re-attached record is written
// again on the kept lease; a new lease is granted only when the TTL changes
// or the lease has gone. The age of a heartbeat is measured by the store: the
// lease's granted TTL minus its remaining TTL, which etcd reports in whole
// seconds, so ages are reported as the lower bound (up to a second younger
// than the truth) and HeartbeatAt is the reader's clock minus that age.
// Record.TTL and Member.TTL are likewise whole seconds, rounded down. The
// backend's own memory of heartbeat leases (and of keys it found held) is
// swept once a minute, so it stays bounded like the store's.
//
// To keep lease keys and heartbeat keys apart, keys must not contain
// "/heartbeat/" or a NUL byte, nor end with "/heartbeat"; such keys are
// rejected with backend.ErrInvalid.
//
// # Watch
//
// Every Watch of a Backend is served by one etcd watch over the Backend's
// prefix, started by the first Watch and stopped with the last subscription
// or Close: one goroutine hands each event to the subscriptions of its key
// with non-blocking sends, so a subscription costs no goroutine (here or in
// the etcd client), and records nobody watches (heartbeats, waiter
// registrations, other keys) are dropped after a map look-up. A Watch made
// while the shared watch runs returns at once, with no request; every change
// committed after it returns reaches it. The watch covers each key, its
// entries, and the lease marks (see "Release of a lease on a session"): a
// deletion of the key (or of an entry) whose revision also deleted a lease
// mark is reported as backend.EventExpired, unless the same transaction
// wrote the release marker <prefix><key>\x00 (as earlier versions' Release
// of a Detached lease or of an entry did); any other deletion, a Release
// (which writes no marker) or a deletion by hand, as
// backend.EventReleased. Every creation
// or rewrite of the key or of a holder or intent entry is
// backend.EventChanged; waiters are reported only when they go (see
// above). A subscription whose channel is full loses ordinary
// events (those buffered already tell the receiver to look), never a reset.
// The watch requires an etcd leader (clientv3.WithRequireLeader), so a
// member cut off from its cluster does not keep a silent watch. When the
// watch is cancelled by the server or the client (no leader, compaction, a
// broken connection the client cannot resume), it is re-established from
// the next revision, or from the current one if the next has been compacted
// away, and then backend.EventReset goes to every subscription: the store
// may have restarted, and after a compaction changes may have been missed,
// so a holder renews at once and a waiter re-reads. The etcd client itself
// resumes its watches over a new connection without telling anyone; so each
// Backend also follows its client's gRPC connection (one goroutine, from its
// first established watch until Close) and every subscription gets
// backend.EventReset when the connection is ready again after a break, a
// server restart say; the Backend first reads the store's revision (one
// request per Backend), and if that went back (a server that came back
// without its data starts revisions over) it starts the watch over from the
// current revision, which the etcd client would otherwise have resumed from
// the old one and kept silent. A reset is never dropped: when it does not
// fit in a channel's buffer, that channel is closed instead, which tells the
// receiver the same. Otherwise a channel closes only when its watch's
// context ends, the Backend is closed, or the etcd client is closed.
//
// # The etcd client
//
// Create the client from ClientConfig, adding TLS, credentials or a logger to
// the configuration it returns:
//
//	cfg := etcdbackend.ClientConfig("10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379")
//	cfg.TLS = tlsConfig // if the cluster uses TLS
//	cli, err := clientv3.New(cfg)
//
// A bare clientv3.Config reconnects with gRPC's default backoff (pauses from
// 1 s growing to 2 minutes), and every call waits for a connection until its
// context ends: after etcd was down for 2 s, calls kept timing out for 1.6 to
// 3 s after the server was back (measured on loopback; the pause grows with
// the outage). ClientConfig retries at most 1 s apart (the same outage: 0.3
// to 0.9 s), and detects a dead connection with keep-alive pings (see its
// doc). The backend also helps a client configured otherwise: when a call
// finds all of the client's connections failed and waiting out the backoff,
// it makes the client reconnect at once (at most 10 times a second), so the
// first call after the server is back gets through within one connection
// attempt.
package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"

	"github.com/sovereign-go/sovereign/backend"
)

// Defaults of Options.
const (
	// DefaultPrefix is the default key prefix.
	DefaultPrefix = "sovereign/"
	// DefaultRequestTimeout is the default bound of one call.
	DefaultRequestTimeout = 10 * time.Second
)

// maxTTLSeconds is the longest lease etcd grants (its MaxLeaseTTL).
const maxTTLSeconds = 9_000_000_000

// Connection settings of ClientConfig.
const (
	// reconnectMaxDelay is the longest pause between two attempts to
	// reconnect to an etcd endpoint.
	reconnectMaxDelay = time.Second
	// reconnectBaseDelay is the pause after the first failed attempt.
	reconnectBaseDelay = 100 * time.Millisecond
	// connectTimeout bounds one connection attempt (TCP and TLS handshake).
	connectTimeout = 3 * time.Second
	// keepAliveTime is how long a connection may stay silent before the
	// client pings the server: gRPC's minimum, also above etcd's default
	// --grpc-keepalive-min-time (5 s), below which etcd drops the
	// connection for pinging too often.
	keepAliveTime = 10 * time.Second
	// keepAliveTimeout is how long the client waits for the answer to a
	// ping before it drops the connection and reconnects.
	keepAliveTimeout = 3 * time.Second
	// dialTimeout bounds the client's start-up exchanges (authentication).
	dialTimeout = 5 * time.Second
)

// ClientConfig returns the etcd client configuration this package is tested
// with, for the given endpoints: use it (adding TLS, credentials and a
// logger to it as needed) rather than a bare clientv3.Config, because a bare
// one reconnects slowly after etcd restarts.
//
// A clientv3 client reconnects with gRPC's default backoff, whose pauses
// grow from 1 s by a factor of 1.6 up to 2 minutes, while every call waits
// for a connection until its context ends: after an etcd outage of a few
// seconds, calls keep timing out for seconds after the server is back, long
// enough for leases to expire with nobody able to acquire them. The
// configuration returned here retries after 100 ms, growing to at most 1 s,
// so the client is connected again within about a
// second of the server's return; bounds one connection attempt to 3 s (gRPC's
// default is 20 s, which an endpoint that drops packets would cost on every
// attempt); and pings a connection that has been silent for 10 s, dropping
// it when the answer takes more than 3 s, so a connection that died without
// being closed (a crashed host, a network partition) is replaced after about
// 13 s instead of hanging until the operating system gives up on it.
// DialTimeout (5 s) bounds only the client's start-up exchanges:
// clientv3.New does not wait for a connection.
func ClientConfig(endpoints ...string) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          dialTimeout,
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: keepAliveTimeout,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  reconnectBaseDelay,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   reconnectMaxDelay,
			},
			MinConnectTimeout: connectTimeout,
		})},
	}
}

// Options configures a Backend. The zero value and nil mean all defaults.
type Options struct {
	// Prefix is put before every key the backend writes, to share a cluster
	// with other data. It must end with "/" and contain no NUL byte.
	// Default: "sovereign/".
	Prefix string
	// RequestTimeout bounds each call (Watch: until the watch is
	// established), also when the caller's context has no deadline, so an
	// unreachable cluster never hangs a caller. The caller's context still
	// applies when it ends earlier. Zero means the default; negative is an
	// error. Default: 10 seconds.
	RequestTimeout time.Duration
}

// Backend is a backend.Backend and backend.Watcher on etcd. It is safe for
// concurrent use. Create it with New.
type Backend struct {
	cli     *clientv3.Client
	kv      pb.KVClient // cli's KV service, for transactions built as protocol messages (see txn)
	prefix  string
	timeout time.Duration

	life context.Context    // cancelled by Close; ends watch goroutines
	stop context.CancelFunc // cancels life

	mu         sync.Mutex           // guards the fields below
	closed     bool                 // set by Close
	hb         map[string]*hbEntry  // heartbeat leases by heartbeat key
	held       map[string]time.Time // keys last seen held, and when (see seenHeld)
	waits      map[string]waitState // registrations made here, by waitMapKey
	lastSweep  time.Time            // when sweep last ran
	monitoring bool                 // the connection monitor runs (see monitor)
	reset      chan struct{}        // closed, and replaced, when the connection is back after a break
	lastNudge  time.Time            // when nudge last reset the reconnect backoff
	sessions   map[int64]*session   // session leases by requested TTL in seconds
	hbSessions map[int64]*hbSession // heartbeat sessions by requested TTL in seconds
	// owned holds, by session lease, the token of every key this Backend
	// acquired on it and has not released or found lost (RenewBatch's
	// owner check).
	owned map[clientv3.LeaseID]map[string]string
	// pending counts, by key, the acquisitions on a session in flight
	// (from before their transaction is sent until they are recorded in
	// owned or have failed): RenewBatch's sweep of orphans skips them.
	pending map[string]int
	// looked holds, by session lease with keys held here, the mark of its
	// last look-up that succeeded; lookChanges counts the changes the
	// watch delivered that a look-up could see (see coveredRenewal).
	looked      map[clientv3.LeaseID]lookMark
	lookChanges uint64

	ka kaStream // the keep-alive stream (see keepAliveOnce)

	watches sync.WaitGroup // watch goroutines, the connection monitor, the keep-alive reader and background clean-ups

	// withdrawalHook, when set (by tests only), runs at the stages of
	// expireRegistrations (see withdrawalStage).
	withdrawalHook atomic.Pointer[func(stage string)]
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Watcher = (*Backend)(nil)
)

// New returns a Backend that stores its leases through client, which stays
// the caller's: Close does not close it. opts may be nil.
func New(client *clientv3.Client, opts *Options) (*Backend, error) {
	if client == nil {
		return nil, errors.New("etcdbackend: nil client")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	switch {
	case !strings.HasSuffix(o.Prefix, "/"):
		return nil, fmt.Errorf("etcdbackend: prefix %q does not end with \"/\"", o.Prefix)
	case strings.ContainsRune(o.Prefix, 0) || !utf8.ValidString(o.Prefix):
		return nil, fmt.Errorf("etcdbackend: prefix %q contains a NUL byte or invalid UTF-8", o.Prefix)
	}
	switch {
	case o.RequestTimeout < 0:
		return nil, fmt.Errorf("etcdbackend: negative request timeout %v", o.RequestTimeout)
	case o.RequestTimeout == 0:
		o.RequestTimeout = DefaultRequestTimeout
	}
	life, stop := context.WithCancel(context.Background())
	return &Backend{
		cli:     client,
		kv:      clientv3.RetryKVClient(client),
		prefix:  o.Prefix,
		timeout: o.RequestTimeout,
		life:    life,
		stop:    stop,
		hb:      make(map[string]*hbEntry),
		held:    make(map[string]time.Time),
		waits:   make(map[string]waitState),
		reset:   make(chan struct{}),

		sessions:   make(map[int64]*session),
		hbSessions: make(map[int64]*hbSession),
		owned:      make(map[clientv3.LeaseID]map[string]string),
		pending:    make(map[string]int),
		looked:     make(map[clientv3.LeaseID]lookMark),
	}, nil
}

// Close ends every watch of the backend, waits for their goroutines, and
// makes later calls return backend.ErrClosed. It does not close the etcd
// client, and leaves leases and heartbeat records to expire or be released.
// Close is idempotent.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.stop()
	b.watches.Wait()
	return nil
}

// begin checks that the backend is open and ctx alive, and returns ctx
// bounded by the request timeout (ctx itself when its deadline comes no
// later than that), with the function releasing what the bound took.
func (b *Backend) begin(ctx context.Context, op string) (context.Context, context.CancelFunc, error) {
	b.mu.Lock()
	closed := b.closed
	if now := time.Now(); !closed && now.Sub(b.lastSweep) >= sweepInterval {
		b.lastSweep = now
		b.sweepLocked(now)
	}
	b.mu.Unlock()
	if closed {
		return nil, nil, fmt.Errorf("etcdbackend: %s: %w", op, backend.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("etcdbackend: %s: %w", op, err)
	}
	b.nudge()
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= b.timeout {
		// ctx ends first anyway (package lock and the elector bound their
		// calls themselves): a timer of our own would never fire first.
		return ctx, func() {}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	return ctx, cancel, nil
}

// sweepInterval is how often the backend forgets local state about keys it
// no longer uses (see sweepLocked).
const sweepInterval = time.Minute

// sweepLocked drops the backend's local state about keys it no longer uses,
// so that it stays bounded like the store's: heartbeat leases whose TTL has
// passed since their last refresh (etcd has dropped them too; a later
// Heartbeat grants a new one) and held-key hints older than sweepInterval
// (a stale hint only costs a read). It runs at most every sweepInterval, from
// a call, with b.mu held.
func (b *Backend) sweepLocked(now time.Time) {
	for k, e := range b.hb {
		if !e.mu.TryLock() {
			continue // in use
		}
		if now.After(e.expires) {
			e.dropped = true
			delete(b.hb, k)
		}
		e.mu.Unlock()
	}
	for k, at := range b.held {
		if now.Sub(at) >= sweepInterval {
			delete(b.held, k)
		}
	}
	for k, w := range b.waits {
		if now.After(w.expires) {
			delete(b.waits, k)
		}
	}
}

// nudgeInterval is the least time between two resets of the client's
// reconnect backoff by nudge.
const nudgeInterval = 100 * time.Millisecond

// nudge makes the client try to reconnect at once when all its connections
// have failed and it is waiting out gRPC's reconnect backoff (up to 2
// minutes with gRPC's defaults), so that a call made after etcd is back
// finds it within a connection attempt, whatever backoff the client was
// configured with. It resets the backoff at most every nudgeInterval, so a
// burst of calls against a server that is down makes at most 10 connection
// attempts a second; when the client is connected or connecting it does
// nothing but read the connection's state.
func (b *Backend) nudge() {
	conn := b.cli.ActiveConnection()
	if conn == nil || conn.GetState() != connectivity.TransientFailure {
		return
	}
	now := time.Now()
	b.mu.Lock()
	if now.Sub(b.lastNudge) < nudgeInterval {
		b.mu.Unlock()
		return
	}
	b.lastNudge = now
	b.mu.Unlock()
	conn.ResetConnectBackoff()
}

// fail wraps err from an etcd call made with ctx. When ctx has ended, the
// result also wraps ctx's error, so errors.Is(err, context.Canceled) and
// errors.Is(err, context.DeadlineExceeded) work whatever the client returned.
func fail(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("etcdbackend: %s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("etcdbackend: %s: %w", op, err)
}

// checkKey rejects keys that would make the key layout ambiguous.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", backend.ErrInvalid)
	case strings.ContainsRune(key, 0):
		return fmt.Errorf("%w: key %q contains a NUL byte", backend.ErrInvalid, key)
	case strings.Contains(key, heartbeatInfix) || strings.HasSuffix(key, heartbeatSuffix):
		return fmt.Errorf("%w: key %q contains %q or ends with %q", backend.ErrInvalid, key, heartbeatInfix, heartbeatSuffix)
	}
	return nil
}

// ttlSeconds rounds ttl up to whole seconds, the unit of etcd leases.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("%w: TTL %v is not positive", backend.ErrInvalid, ttl)
	}
	s := int64(ttl / time.Second)
	if ttl%time.Second != 0 {
		s++
	}
	if s > maxTTLSeconds {
		return 0, fmt.Errorf("%w: TTL %v exceeds etcd's maximum of %d seconds", backend.ErrInvalid, ttl, int64(maxTTLSeconds))
	}
	return s, nil
}

const (
	heartbeatSuffix = "/heartbeat"
	heartbeatInfix  = heartbeatSuffix + "/"
)

// heartbeatInfixBytes and leaseMarkPartBytes are heartbeatInfix and
// leaseMarkPart, for the look-ups of RenewBatch, which test the keys of a
// session as they come, in bytes, without a string of each.
var (
	heartbeatInfixBytes = []byte(heartbeatInfix)
	leaseMarkPartBytes  = []byte(leaseMarkPart)
)

// leaseKey is the etcd key of key's lease record.
func (b *Backend) leaseKey(key string) string { return b.prefix + key }

// heartbeatPrefix is the etcd key prefix of key's heartbeat records.
func (b *Backend) heartbeatPrefix(key string) string { return b.prefix + key + heartbeatInfix }

// heartbeatKey is the etcd key of instance id's heartbeat record for key.
func (b *Backend) heartbeatKey(key, id string) string { return b.heartbeatPrefix(key) + id }

// ValidateKey reports, without I/O, whether key can be stored: it must not be
// empty, contain a NUL byte or "/heartbeat/", or end with "/heartbeat" (see
// the package doc). The error wraps backend.ErrInvalid.
func (b *Backend) ValidateKey(key string) error { return checkKey(key) }

// MinTTL returns one second, the smallest lease TTL etcd grants. A server
// with etcd's default timing grants at least 2 s whatever is asked (see the
// package doc); Lease.TTL says what was granted.
func (b *Backend) MinTTL() time.Duration { return time.Second }
