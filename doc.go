// Package sovereign is leader election for Go daemons that run several
// replicas but need exactly one of them active: a scheduler, a cron runner, a
// migration runner, a queue consumer.
//
// An Elector campaigns for one election over a backend (Redis with package
// redisbackend, etcd with etcdbackend, or the in-memory memorybackend for
// tests) and calls your function while it leads:
//
//	b, _ := redisbackend.New(redisClient, nil)
//	e, err := sovereign.New(b, "billing-cron", hostname, nil)
//	if err != nil { ... }
//	err = e.Run(ctx, func(ctx context.Context) error {
//		// Leader work. ctx is cancelled the moment leadership is lost or
//		// no longer certain; return promptly when it is.
//		return runScheduler(ctx)
//	})
//
// Run keeps campaigning after every lost term until its context ends; the
// function is called again each time the elector becomes leader. Anyone can
// read who leads, since when and under which term with Leader, and follow
// changes with Subscribe or Observe.
//
// # States and events
//
// An elector is a Follower (another instance leads), a Candidate (no leader is
// known and it is acquiring) or the Leader. Every transition is published as
// an event (StateChanged, LeadershipAcquired, LeadershipLost, LeaderChanged,
// ElectionFailed); see Subscribe for the delivery contract.
//
// # How leadership works
//
// The lease is acquired atomically with a TTL, only when the key is free, and
// carries a fencing term that is strictly greater than every earlier term of
// the election, and a random token, so that two instances configured with the
// same ID never share a lease. After acquiring, the elector reads the record
// back and checks holder, token and term (double verification) before it
// leads. The leader renews every RenewInterval; renewals and releases are
// owner-checked by the token. Every instance writes a heartbeat record every
// HeartbeatInterval. Followers schedule their next attempt from the lease's
// remaining TTL and, where the backend can watch, wake at once on a release,
// so a graceful hand-over takes milliseconds and a crashed leader is replaced
// about one TTL after its last renewal. Backend errors are retried with
// jittered backoff; an outage is reported (ElectionFailed), never fatal.
//
// # What is guaranteed
//
// The leader counts its lease from the moment it sent the last acquire or
// renewal that succeeded, and steps down by itself RenewDeadline later if no
// renewal has succeeded since: IsLeader turns false, Term returns 0, and the
// leader context is cancelled. The backend keeps the lease for TTL after it
// received that request, which is later. So no two electors believe they lead
// at the same time, provided that
//
//   - the backend keeps a lease for its TTL (a Redis failover with
//     asynchronous replication can lose it: see redisbackend's WaitReplicas,
//     or use etcd);
//   - the clocks of the leader's machine and of the backend do not drift
//     apart by more than TTL - RenewDeadline over one TTL (3 s in 10 s with the
//     defaults; real clocks drift by parts per million). Only clock rates
//     matter: all deadlines use the monotonic clock, and wall-clock jumps have
//     no effect;
//   - all instances of an election use the same Options.
//
// IsLeader checks the deadline against the clock on every call, so even a
// process that was paused (a long GC pause, SIGSTOP, a suspended VM) answers
// false as soon as it runs again; the leader context is cancelled by a timer
// that fires at the deadline even if the elector's own goroutine is stuck.
//
// What no lease can guarantee is that a process paused between checking its
// leadership and acting on it does not act late. That is what the fencing
// term is for: pass Term (or TermFromContext(leaderCtx)) with every write to a
// downstream system and have it reject a term lower than the highest it has
// seen (for SQL: UPDATE ... WHERE fencing_term <= $term). With that, a stale
// leader's late write is refused rather than applied.
//
// # Testing your code
//
// Swap the real backend for memorybackend in your tests. It is safe for
// concurrent use, can partition, hang or slow down one candidate's calls, and
// works inside testing/synctest bubbles, where the elector's timers run on
// virtual time: a failover test takes microseconds.
package sovereign
