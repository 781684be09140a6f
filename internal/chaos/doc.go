// Package chaos is Sovereign's fault-injection checker: real candidate
// processes (package candidate, built by the test) campaign on one election,
// each through its own TCP fault proxy, in front of a real redis-server or an
// embedded etcd; the test kills, pauses, cuts off and slows down the leader,
// restarts and crashes redis-server with and without its data, and starts and
// stops processes sharing the leader's instance ID, at random, and then
// checks, from the processes' own logs on the machine's monotonic clock and
// from a fenced store every leader writes to, that no two leaderships ever
// overlapped (after the store lost its data: only inside the bounded
// data-loss window) and that no stale write got through. In the lock mode the
// candidates loop on lock.Locker.Do for one key instead, handing the lock
// from one to another, and the same checks apply to the holds; in the
// semaphore mode they take a Shared lock of 2 permits, and never more than 2
// holds may be live at once (outside data-loss windows). In the Cluster
// mode the candidates use a Redis Cluster with WaitReplicas 1 while the
// master serving their key is failed over, crashed and replaced by its
// replica, or paused, and no overlap is excused. See README.md for what
// exactly is checked and how to run the long form.
//
// The package holds the pieces the test and the candidate binary share: the
// clock (Now), the log record (Line), the fault proxy (Proxy), the fenced
// store (Store) and the analysis of a run (Analyze). It is internal and
// exists only for tests.
package chaos
