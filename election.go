package sovereign

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
)

// Sentinel errors, for errors.Is.
var (
	// ErrClosed is returned by methods called after Close.
	ErrClosed = errors.New("sovereign: elector closed")
	// ErrNotLeader is returned by Resign when the elector does not lead.
	ErrNotLeader = errors.New("sovereign: not leader")
	// ErrNoLeader is returned by Leader when nobody holds the election.
	ErrNoLeader = errors.New("sovereign: no leader")
	// ErrStarted is returned by Start and Run when the elector already runs.
	ErrStarted = errors.New("sovereign: elector already started")
	// ErrLeadershipLost is the cause (context.Cause) of a cancelled leader
	// context. It wraps nothing else; the LossReason is in the message and in
	// the LeadershipLost event.
	ErrLeadershipLost = errors.New("sovereign: leadership lost")
	// ErrVerificationFailed is reported (in an ElectionFailed event) when the
	// record read back after a successful acquisition is not the lease just
	// acquired.
	ErrVerificationFailed = errors.New("sovereign: double verification failed")
)

// Elector campaigns for one election on behalf of one instance. Create it
// with New, then either call Run with the function to run while leading, or
// Start it and watch IsLeader and the events. All methods are safe for
// concurrent use.
type Elector struct {
	b        backend.Backend
	watcher  backend.Watcher        // nil when b cannot watch
	notifier backend.WatchNotifier  // nil when b's watches cannot wake the elector
	renewals backend.RenewalWatcher // nil when b's watches cannot tell of renewals
	muter    backend.RenewalMuter   // nil when they cannot be muted
	// renewalsMuted mutes the renewal events of the watch (muter) while
	// this elector leads: they are of its own lease, and each would wake it
	// (on Redis the watch's connection then leaves the key's renewals
	// channel, so they do not reach this process at all).
	renewalsMuted backend.Mute
	name          string
	id            string
	// okAt is when the backend last answered a call of this elector, in
	// nanoseconds since okBase (its creation; noAnswer before the first
	// answer): an atomic beside what a batch reads, not a field under mu,
	// because every renewal and heartbeat of every election sets it.
	okAt   atomic.Int64
	okBase time.Time
	opts   Options
	log    *slog.Logger
	bus    *bus

	rs runState   // the loop's state machine; its runner's alone (see run.go)
	w  watchState // the subscription to the key; the runner's alone
	// limit bounds the calls in flight of every elector of the process on
	// this backend; nil when it has none. Set and cleared by the loop.
	limit *callLimit
	// watching is true while a watch that delivers every expiry
	// (backend.ExpiryReporter) is established, so a follower need not poll.
	watching atomic.Bool

	mu    sync.Mutex // guards the fields below
	state State
	// lostContact reports a heartbeat that failed while not leading (the
	// first of a run), not yet seen by the campaign loop (see suspect);
	// lostAt is when it failed.
	lostContact bool
	lostAt      time.Time
	term        uint64       // term of the current leadership; 0 when not leading
	hold        *keeper.Hold // the lease of the current leadership; nil when not leading
	cur         *leaderTerm  // the current term, from acquisition until its lease is released; nil otherwise
	leader      Record       // last known leader; HolderID "" when none
	stale       staleState   // what this elector knows of the leader's heartbeats
	health      health       // what Check reads
	started     bool
	closed      bool
	cancel      context.CancelFunc
	done        chan struct{} // set in New, never reassigned: closed when every goroutine of the elector has ended
	closing     chan struct{} // closed when Close has finished; nil before Close

	wmu    sync.Mutex      // guards woken, parked and queue: the machine's wake-ups (see run.go)
	woken  bool            // a wake-up came since the runner last looked
	parked bool            // the machine waits with no goroutine; a wake-up starts a runner
	queue  []resignRequest // Resign requests the machine has yet to take
	wakeC  chan struct{}   // capacity 1: wakes a runner blocked on a subscription that cannot wake it

	wg sync.WaitGroup // the loop's runners, leader-function goroutines and holds
}

// New returns an Elector for the election name, campaigning as the instance
// id over backend b. opts may be nil for defaults. New does no I/O; errors
// wrap ErrInvalidOptions.
func New(b backend.Backend, name, id string, opts *Options) (*Elector, error) {
	switch {
	case b == nil:
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidOptions)
	case name == "":
		return nil, fmt.Errorf("%w: empty election name", ErrInvalidOptions)
	case id == "":
		return nil, fmt.Errorf("%w: empty instance ID", ErrInvalidOptions)
	case strings.HasPrefix(name, backend.LockKeyPrefix):
		return nil, fmt.Errorf("%w: election name %q: names beginning with %q are reserved for package lock",
			ErrInvalidOptions, name, backend.LockKeyPrefix)
	}
	if err := b.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("%w: election name %q cannot be stored by this backend: %w", ErrInvalidOptions, name, err)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Metrics == nil {
		o.Metrics = NopMetrics{}
	}
	if min := b.MinTTL(); o.TTL < min {
		return nil, fmt.Errorf("%w: TTL (%v) is below the backend's minimum of %v", ErrInvalidOptions, o.TTL, min)
	}
	log := o.Logger.With("election", name, "id", id)
	if keeper.NoRetryBudget(o.RenewInterval, o.RenewDeadline) {
		log.Warn("sovereign: a renewal that times out is not retried before the renew deadline: one slow reply ends the leadership; "+
			"lower RenewInterval so that RenewInterval*5/4 < RenewDeadline",
			"renew_interval", o.RenewInterval, "renew_deadline", o.RenewDeadline)
	}
	e := &Elector{
		b:      b,
		name:   name,
		id:     id,
		opts:   o,
		log:    log,
		bus:    newBus(log, func() { o.Metrics.EventsDropped(name, 1) }),
		wakeC:  make(chan struct{}, 1),
		done:   make(chan struct{}),
		okBase: time.Now(),
	}
	e.okAt.Store(noAnswer)
	e.watcher, _ = b.(backend.Watcher)
	if e.watcher != nil {
		e.notifier, _ = b.(backend.WatchNotifier)
		e.renewals, _ = b.(backend.RenewalWatcher)
		e.muter, _ = b.(backend.RenewalMuter)
	}
	return e, nil
}

// Options returns the options in effect, defaults applied.
func (e *Elector) Options() Options { return e.opts }

// ID returns the instance ID the elector campaigns as.
func (e *Elector) ID() string { return e.id }

// Name returns the election's name.
func (e *Elector) Name() string { return e.name }

// Start starts campaigning in the background and returns at once. The
// elector campaigns, leads and campaigns again after every lost term until
// ctx ends or Close is called; after ctx ends, call Close anyway to stop
// event delivery. Use Run instead to have a function called while leading.
// A started elector that waits costs no goroutine (see the package doc).
func (e *Elector) Start(ctx context.Context) error {
	return e.start(ctx, nil)
}

// Run campaigns until ctx ends, calling fn each time this elector becomes
// leader. fn receives a leader context that is cancelled the moment
// leadership is lost or no longer certain (renew deadline passed), on Resign,
// and when ctx ends; it must then stop its leader work and return. After a
// pause (a long GC pause, SIGSTOP) the timer that cancels the leader context
// falls due together with fn's own timers, and a select may see fn's first:
// call IsLeader, which reads the clock, right before each action. The lease
// is released only after fn has returned, and renewed meanwhile, so no other
// instance leads while fn still runs, unless the lease was lost at the
// backend. When fn returns by itself the term ends (the lease is released)
// and the elector campaigns again after ResignSitOut. Run never gives up
// after a backend outage; it returns when ctx ends, after closing the
// elector (see Close), with nil; or ErrStarted / ErrClosed at once when the
// elector already ran. An acquisition whose reply comes after ctx ended
// (every replica stopped at once) is released at once, and fn does not
// start for it. fn runs on a goroutine of its own, started for each term;
// the elector itself waits for it without one.
func (e *Elector) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return fmt.Errorf("%w: nil leader function", ErrInvalidOptions)
	}
	if err := e.start(ctx, fn); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-e.done: // closed by another caller's Close
	}
	return e.Close()
}

func (e *Elector) start(ctx context.Context, fn func(context.Context) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if e.started {
		return ErrStarted
	}
	e.started = true
	e.health.startedAt = time.Now()
	ctx, e.cancel = context.WithCancel(ctx)
	e.startRunner(ctx, fn)
	return nil
}

// Close stops campaigning. If the elector leads, it steps down: the leader
// context is cancelled, Close waits for the leader function to return, then
// releases the lease (with a fresh context bounded by RequestTimeout). Close
// returns once every goroutine the elector started has ended and every
// queued event has been delivered. It is idempotent and safe to call
// concurrently; it must not be called from the leader function or a
// listener, which it waits for.
func (e *Elector) Close() error {
	e.mu.Lock()
	if e.closing != nil {
		closed := e.closing
		e.mu.Unlock()
		<-closed // a channel, not a mutex: durably blocking inside synctest
		return nil
	}
	e.closing = make(chan struct{})
	e.closed = true
	cancel, started := e.cancel, e.started
	e.mu.Unlock()
	if started {
		cancel()
		<-e.done
		e.wg.Wait()
	} else {
		close(e.done)
	}
	e.bus.close()
	close(e.closing)
	return nil
}

// IsLeader reports whether this elector leads now. It checks the renew
// deadline against the monotonic clock on every call, so it never answers
// true past the deadline, even right after the process was paused and before
// any of the elector's goroutines ran again.
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leadingLocked()
}

func (e *Elector) leadingLocked() bool {
	return e.state == Leader && e.hold != nil && e.hold.Held()
}

// State returns the elector's state. Like IsLeader, it reports Follower
// rather than Leader once the renew deadline has passed.
func (e *Elector) State() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == Leader && !e.leadingLocked() {
		return Follower
	}
	return e.state
}

// Term returns the fencing term of the current leadership, or 0 when the
// elector does not lead. Pass it with every write to a downstream store that
// rejects terms lower than the highest it has seen.
func (e *Elector) Term() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leadingLocked() {
		return 0
	}
	return e.term
}

// Leader reads the current leader's record from the backend: who, since
// when, which term, its last heartbeat and metadata. It returns an error
// wrapping ErrNoLeader when nobody leads.
func (e *Elector) Leader(ctx context.Context) (Record, error) {
	r, err := e.b.Get(ctx, e.name)
	if errors.Is(err, backend.ErrNotHeld) {
		return Record{}, fmt.Errorf("%w: %w", ErrNoLeader, err)
	}
	return r, err
}

// Members returns the live heartbeat records of the election's instances.
func (e *Elector) Members(ctx context.Context) ([]backend.Member, error) {
	return e.b.Members(ctx, e.name)
}

// Resign gives up leadership: the leader context is cancelled at once, and
// the lease is released as soon as the leader function has returned. The
// elector then sits out for ResignSitOut before campaigning again, so another
// instance takes over. Resign returns once the lease is released, or, when
// called with a context derived from this elector's leader context (from
// inside the leader function), as soon as the step-down has begun. It returns
// ErrNotLeader when the elector does not lead, and ctx's error if ctx ends
// before the release begins (the lease is then released in the background
// once the leader function has returned); a release under way is not
// abandoned, and ends within RequestTimeout. The step-down and the release
// run on the caller's goroutine, so a hand-over waits for no other work of
// the elector; IsLeader answers false and the LeadershipLost event is
// published before the release is sent.
func (e *Elector) Resign(ctx context.Context) error {
	e.mu.Lock()
	closed, started := e.closed, e.started
	e.mu.Unlock()
	done := e.done
	if closed {
		return ErrClosed
	}
	if !started {
		return ErrNotLeader
	}
	li, inside := ctx.Value(leaderKey{}).(*leaderInfo)
	inside = inside && li.e == e
	if !inside {
		e.mu.Lock()
		t := e.cur
		e.mu.Unlock()
		if t != nil {
			return e.resignTerm(ctx, t)
		}
	}
	req := resignRequest{begun: make(chan error, 1), released: make(chan error, 1)}
	// The loop takes the request from its queue and answers every request
	// it takes; one it has not taken is withdrawn when the caller stops
	// waiting, and never acted on.
	e.submit(req)
	if inside {
		// Called from inside the leader function: its leader context ends at
		// step-down, so wait for the step-down itself, which is prompt.
		select {
		case err := <-req.begun:
			return err
		case <-done:
			if e.withdraw(req) {
				return ErrClosed
			}
		case <-ctx.Done():
			if e.withdraw(req) {
				return ErrNotLeader // that term is already over
			}
		}
		return <-req.begun
	}
	select {
	case err := <-req.released:
		return err
	case <-done:
		if e.withdraw(req) {
			return ErrClosed
		}
	case <-ctx.Done():
		e.withdraw(req)
		return ctx.Err()
	}
	select {
	case err := <-req.released:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resignTerm is Resign of term t, on the caller's goroutine: no hop to the
// loop stands between the call and the release. It steps down
// (IsLeader false, the leader context cancelled, the events published),
// waits for the leader function to return, then releases the lease through
// the keeper, owner-checked. The loop, once woken, waits for this
// release and ends the term as resigned; should the term have ended already
// for another reason, the release is still what Resign waits for. The loop is
// woken only when Resign returns, so that it does not compete with the
// release.
func (e *Elector) resignTerm(ctx context.Context, t *leaderTerm) error {
	defer t.wakeLoop()
	e.endTerm(t, ReasonResigned, nil)
	if t.fnDone != nil {
		select {
		case <-t.fnDone:
		case <-ctx.Done():
			return ctx.Err() // the loop releases once the function has returned
		}
	}
	if err := ctx.Err(); err != nil {
		return err // the loop releases, with a context of its own
	}
	// A release under way is not abandoned when ctx ends: cut short, it
	// would be retried only after a backoff, delaying the hand-over. It is
	// bounded by RequestTimeout.
	err := t.hold.Release(context.WithoutCancel(ctx))
	if errors.Is(err, backend.ErrLeaseLost) {
		return nil // nothing was left to release
	}
	return err
}

type resignRequest struct {
	begun    chan error // step-down has begun (or the request failed)
	released chan error // the lease is released (or the request failed)
}

func (r resignRequest) reply(begun, released error) {
	r.begun <- begun
	r.released <- released
}

// leaderKey is the context key of a leader context's *leaderInfo.
type leaderKey struct{}

type leaderInfo struct {
	e    *Elector
	term uint64
}

// TermFromContext returns the fencing term of the leadership that ctx (a
// leader context passed to Run's function, or one derived from it) belongs
// to.
func TermFromContext(ctx context.Context) (term uint64, ok bool) {
	li, ok := ctx.Value(leaderKey{}).(*leaderInfo)
	if !ok {
		return 0, false
	}
	return li.term, true
}

// setState records a state change and publishes it.
func (e *Elector) setState(to State) {
	e.mu.Lock()
	from := e.state
	e.state = to
	if from != to {
		e.bus.publish(StateChanged{From: from, To: to})
	}
	e.mu.Unlock()
	if from != to {
		e.log.Info("sovereign: state changed", "from", from, "to", to)
	}
}

// setLeader records the leader this elector knows of, publishing
// LeaderChanged when the holder or term differs.
func (e *Elector) setLeader(r Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.HolderID == e.leader.HolderID && r.Term == e.leader.Term {
		e.leader = r
		return
	}
	e.leader = r
	e.bus.publish(LeaderChanged{Leader: r})
}

// heartbeatFailed reports a heartbeat that failed, the n-th in a row: the
// first while not leading tells the campaign loop that contact with the
// store was lost (see suspect). Only the first: a heartbeat that keeps
// failing (heartbeats are information) must not keep a candidate waiting.
func (e *Elector) heartbeatFailed(n int, err error) {
	if n == 1 {
		e.mu.Lock()
		if e.state != Leader {
			e.lostContact, e.lostAt = true, time.Now()
		}
		e.mu.Unlock()
	}
	e.failed("heartbeat", err)
}

func (e *Elector) failed(msg string, err error) {
	if msg == "renew" {
		e.opts.Metrics.RenewFailed(e.name)
	}
	e.log.Warn("sovereign: "+msg, "err", err)
	e.bus.publish(ElectionFailed{Err: fmt.Errorf("%s: %w", msg, err)})
}

// backoff returns the delay before retry number n (1-based) after backend
// errors: exponential from RenewInterval/8 up to RenewInterval, with jitter.
func (e *Elector) backoff(n int) time.Duration {
	d := e.opts.RenewInterval / 8
	for i := 1; i < n && d < e.opts.RenewInterval; i++ {
		d *= 2
	}
	d = min(d, e.opts.RenewInterval)
	return d/2 + rand.N(d/2+1)
}
