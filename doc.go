// Package sovereign is leader election for Go daemons that run several
// replicas but need exactly one of them active: a scheduler, a cron runner, a
// migration runner, a queue consumer.
//
// An Elector campaigns for one election over a backend (Redis with package
// redisbackend, etcd with etcdbackend, or the in-memory memorybackend for
// tests) and calls your function while it leads:
//
//	b, _ := redisbackend.New(redisClient, nil)
//	e, err := sovereign.New(b, "billing-cron", id, nil) // id: unique per replica (hostname-pid), not the hostname
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
// owner-checked by the token. Followers schedule their next attempt from the
// lease's remaining TTL and, where the backend can watch, wake at once on a
// release, so a graceful hand-over takes milliseconds and a crashed leader is
// replaced about one TTL after its last renewal. Backend errors are retried
// with jittered backoff; an outage is reported (ElectionFailed), never fatal.
//
// Only the lease's own TTL, or its holder's release, ends a lease. Every
// instance also writes a heartbeat record every HeartbeatInterval, but
// heartbeats are information: Members lists them, Leader shows the holder's
// last one, and a follower that finds the leader's record missing for longer
// than HeartbeatTTL publishes LeaderStale. None of this ever ends a lease,
// because a record also vanishes while its owner is alive: a store that lost
// its data, an evicted key, a delete by hand, a same-ID instance stopping.
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
//   - the store does not lose or delete a live lease (see below);
//   - the clocks of the leader's machine and of the backend do not drift
//     apart by more than TTL - RenewDeadline over one TTL (3 s in 10 s with the
//     defaults; real clocks drift by parts per million);
//   - all instances of an election use the same Options.
//
// The deadline is kept on the monotonic clock, so a wall clock stepped back
// changes nothing, and on the wall clock as well: IsLeader, State and Term
// answer as not leading once either has passed it. A process that was paused
// (a long GC pause, SIGSTOP) answers false as soon as it runs again, and the
// leader context is cancelled by a timer that fires at the deadline even if
// the elector's own goroutine is stuck. A machine that was suspended (a VM
// frozen by its hypervisor, a laptop asleep) is covered only in part: Linux's
// monotonic clock does not advance during a suspend, so after the resume only
// the wall clock can show that the deadline passed, and only once the guest's
// wall clock has been corrected; until a call to IsLeader (or the next
// renewal, at most RenewInterval later) notices, the leader context stays
// live. A wall clock stepped forward past the deadline makes the leader step
// down early, which is safe.
//
// # When the store loses data
//
// A store that loses a live lease (Redis restarted without persistence, a
// Redis failover to a replica that had not received the write, etcd
// restored from a backup) shows a free key while the old leader still
// believes it leads. Only that lease's TTL ends it, so a candidate that
// lost contact with the store it had heard from (its watch broke, or a
// call failed, a heartbeat included) reads the key instead of acquiring it
// for one TTL, and gives up an acquisition during which its watch broke
// (the call may have reached the store just after a restart): the lease
// it knew still there, it
// campaigns as before; another holder, it follows; no holder, it acquires
// once the TTL is up, when every lease the store could have lost has
// expired. The old leader renews at once when its watch
// breaks, and when its lease is gone acquires again straight away (nobody
// else can have taken the key meanwhile), as a reclaim
// (backend.AcquireRequest.Reclaim) while its old deadline has not passed.
// A candidate that never heard from the store has no lease to wait for,
// unless the store refuses for it: redisbackend's Options.RestartGuard
// refuses every free key but a reclaim until the server has been up for a
// TTL (a backend.HeldError with MayBeHeld; the candidate attempts again
// when the refusal ends). A store that deletes a live lease
// without any sign (an evicted key, a delete by hand, a Redis server whose
// clock was stepped forward, which expires keys early) is taken by no
// follower that heard of the lease's renewals (backend.RenewalWatcher:
// Redis) before a TTL after the last one; the old leader learns of it from
// its next renewal, within RenewInterval + RequestTimeout, and takes the key
// again. A caller that was not watching may take it meanwhile. Fencing terms increase across a loss on
// Redis (they follow the server's clock, see redisbackend) and in memory,
// and on etcd when a restore raises the revision (see etcdbackend), so a
// downstream store that checks terms rejects the old leader's late writes.
//
// What no lease can guarantee is that a process paused between checking its
// leadership and acting on it does not act late. That is what the fencing
// term is for: pass Term (or TermFromContext(leaderCtx)) with every write to a
// downstream system and have it reject a term lower than the highest it has
// seen (for SQL: UPDATE ... WHERE fencing_term <= $term). With that, a stale
// leader's late write is refused rather than applied. Terms are 64-bit (on
// Redis they are large, about the server clock in microseconds): store them
// in a BIGINT, not a 32-bit column. Moving an election from Redis to etcd
// makes its terms drop (etcd's are revisions); give the downstream store a
// new fencing key, or reset its stored term, when you move.
//
// # Cost of an idle elector
//
// An elector that waits (a follower watching the key, a leader between
// renewals, one sitting out after Resign) costs memory, not a goroutine:
// its loop is a state machine that parks while it has nothing to do and is
// resumed, on a short-lived goroutine, by its timer, its watch's
// notification, Resign, Close or the end of the term. Renewals and
// heartbeats of every elector of a process go through shared timers and
// batches, and the watches of a backend share one connection (Redis
// pub/sub, one etcd watch), so ten thousand elections in one process cost
// goroutines independent of their number. This holds on backends whose
// watches notify (backend.WatchNotifier: memorybackend, redisbackend,
// etcdbackend) and on backends that cannot watch; on a backend that watches
// without notifying, each started elector keeps one goroutine blocked on its
// watch. With Run, the leader function runs on a goroutine of its own while
// the elector leads; that one is yours.
//
// # Testing your code
//
// Swap the real backend for memorybackend in your tests. It is safe for
// concurrent use, can partition, hang or slow down one candidate's calls, and
// works inside testing/synctest bubbles, where the elector's timers run on
// virtual time: a failover test takes microseconds.
package sovereign
