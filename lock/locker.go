package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
)

// Prefix is prepended to every lock key to form its backend key, so locks
// and elections never share a key (the elector refuses election names that
// begin with it).
const Prefix = backend.LockKeyPrefix

// DefaultTTL is the default lock TTL.
const DefaultTTL = 10 * time.Second

// Options configure a Locker. A nil *Options means every default. Zero fields
// take their defaults; New validates the result and returns an error wrapping
// ErrInvalidOptions when it is inconsistent. The durations mean what they
// mean for the elector (package sovereign).
type Options struct {
	// TTL is the lease time to live requested from the backend: how long a
	// lock outlives a holder that stopped renewing (crashed). Must be at
	// least the backend's MinTTL.
	// Default: DefaultTTL (10 s).
	TTL time.Duration

	// RenewDeadline is how long a holder keeps a lock after it sent the last
	// acquire or renewal that succeeded; past it the lock's context is
	// cancelled and Held reports false. TTL - RenewDeadline absorbs clock
	// drift. Must be less than TTL.
	// Default: 7/10 of TTL (7 s).
	RenewDeadline time.Duration

	// RenewInterval is how often a held lock is renewed; a failed renewal
	// is retried a quarter of it after the failed attempt was sent (see
	// sovereign.Options.RenewInterval). Must be less than RenewDeadline.
	// Default: 1/2 of TTL (5 s; at most 5/7 of a RenewDeadline set
	// shorter), as for the elector (the locks and
	// elections of a process with one backend and TTL then renew in the
	// same batches).
	RenewInterval time.Duration

	// RequestTimeout bounds every backend call. Must be less than
	// RenewDeadline. TryAcquire and Release given a context that is never
	// cancelled (context.Background, WithoutCancel) bound their call with
	// a context shared by the calls started in the same 1/16 of
	// RequestTimeout (one timer per slice instead of one per call), so
	// such a call gets between 15/16 of RequestTimeout and all of it.
	// Default: 1/5 of TTL (2 s), at most RenewInterval, as for the
	// elector. A periodic renewal waits less when that leaves time for its
	// retry before RenewDeadline (see sovereign.Options.RenewInterval).
	RequestTimeout time.Duration

	// Logger receives failures at Warn, lost locks at Info, acquisitions
	// and releases at Debug. Default: slog.Default().
	Logger *slog.Logger

	// Metrics receives measurements by lock class (see Metrics). Default:
	// none.
	Metrics Metrics

	// Class maps a lock key to its class for Metrics: a bounded set of
	// names ("tally", "extraction"), never the key itself.
	// Default: DefaultClass (the key's first segment).
	Class func(key string) string

	// Policy, when set, is called with the lock key and the acquisition's
	// options before every TryAcquire, Acquire, TryDo and Do, before any
	// store call; an error refuses the acquisition, which then returns an
	// error wrapping ErrPolicy and the policy's error. The options it sees
	// have their defaults applied: TTL is the TTL the lock would get. It
	// must be safe for concurrent use and must not block. Default: none.
	Policy func(key string, opts AcquireOptions) error
}

// withDefaults returns a copy of o (which may be nil) with defaults applied,
// validated against minTTL.
func (o *Options) withDefaults(minTTL time.Duration) (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"TTL", r.TTL}, {"RenewDeadline", r.RenewDeadline},
		{"RenewInterval", r.RenewInterval}, {"RequestTimeout", r.RequestTimeout},
	} {
		if f.d < 0 {
			return r, fmt.Errorf("%w: %s is negative (%v)", ErrInvalidOptions, f.name, f.d)
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
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	if r.Metrics == nil {
		r.Metrics = NopMetrics{}
	}
	if r.Class == nil {
		r.Class = DefaultClass
	}
	return r, r.validate(minTTL)
}

func (r *Options) validate(minTTL time.Duration) error {
	switch {
	case r.TTL < minTTL:
		return fmt.Errorf("%w: TTL (%v) must be at least the backend's MinTTL (%v)", ErrInvalidOptions, r.TTL, minTTL)
	case r.RenewDeadline >= r.TTL:
		return fmt.Errorf("%w: RenewDeadline (%v) must be less than TTL (%v)", ErrInvalidOptions, r.RenewDeadline, r.TTL)
	case r.RenewInterval <= 0 || r.RenewInterval >= r.RenewDeadline:
		return fmt.Errorf("%w: RenewInterval (%v) must be positive and less than RenewDeadline (%v)", ErrInvalidOptions, r.RenewInterval, r.RenewDeadline)
	case r.RequestTimeout <= 0 || r.RequestTimeout >= r.RenewDeadline:
		return fmt.Errorf("%w: RequestTimeout (%v) must be positive and less than RenewDeadline (%v)", ErrInvalidOptions, r.RequestTimeout, r.RenewDeadline)
	}
	return nil
}

// AcquireOptions configure one acquisition. A nil *AcquireOptions means
// every default.
type AcquireOptions struct {
	// Metadata is stored with the lock and shown to anyone who reads its
	// record (Holders, List, a HeldError): a hostname, a request ID, a
	// version.
	Metadata map[string]string

	// TTL overrides the Locker's TTL for this lock; RenewDeadline,
	// RenewInterval and RequestTimeout are scaled with it, keeping the
	// Locker's ratios. Must be at least the backend's MinTTL.
	// Default: the Locker's TTL.
	TTL time.Duration

	// NoRenew disables automatic renewal: the lock is held for one
	// RenewDeadline after its acquisition was sent, and longer only by
	// calling Lock.Extend.
	NoRenew bool

	// MaxHold, when positive, bounds how long the lock is held: that long
	// after its acquisition was sent, renewals stop and the lock's context
	// is cancelled with a cause matching ErrMaxHold and ErrLockLost. Release
	// it then; unreleased, it expires at the store one TTL after its last
	// renewal.
	MaxHold time.Duration

	// MinHold, when positive, keeps the lock at least that long after its
	// acquisition was sent: a Release before then, or the end of a Do or
	// TryDo function, returns at once, and the lock stays held, renewed,
	// until MinHold has passed (or it is lost, or the Locker closed), then
	// is released. A job that every replica starts at each tick under TryDo
	// with a MinHold of most of the period runs once a period, even on a
	// replica whose tick comes after the job has finished elsewhere
	// (ShedLock's lockAtLeastFor), as long as it comes less than MinHold
	// after the first replica's: a replica that reaches a tick later (paused
	// or overloaded across it) should skip it, or it runs the job again and
	// holds the lock across the next tick. At most MaxHold when MaxHold is
	// set; not with NoRenew.
	MinHold time.Duration

	// Mode is Exclusive (the zero value: the holder is alone on the key) or
	// Shared (any number of Shared holders, or at most Limit, hold the key
	// at once, and no Exclusive holder). Shared needs a backend with
	// backend.Modes; without it the acquisition fails with ErrUnsupported.
	//
	// While an Exclusive Acquire or Do waits on a backend whose
	// ModeSupport has WriterFirst, new Shared holders are refused (writer
	// preference), so a stream of readers cannot starve a writer.
	Mode Mode

	// Limit is, for Shared, the most holders the key may have at once (a
	// semaphore of Limit permits); 0 means no limit. Every Shared holder of
	// a key must give the same Limit: one that differs from the live
	// holders' fails with ErrLimitMismatch. Limit must be 0 for Exclusive.
	Limit int

	// Hierarchical treats "/" in the key as levels: a lock on "a/b/c" also
	// takes intent on "a" and "a/b", atomically with the lock, for as long
	// as it is held. It then conflicts with an Exclusive lock on "a" or
	// "a/b" (and, when Exclusive, with a Shared one), and an Exclusive lock
	// on "a" conflicts with it. While an Exclusive Acquire or Do on "a"
	// waits, on a backend whose ModeSupport has AncestorWaiters, new
	// Hierarchical locks below "a" that are not Fair are refused, so a
	// stream of them cannot starve it. Hierarchy is a protocol: every lock
	// of a tree must be taken with Hierarchical (or, for a top-level key,
	// plainly), since a lock taken without it takes no intent. It needs a
	// backend whose ModeSupport has Hierarchical, else ErrUnsupported.
	Hierarchical bool

	// Fair makes Acquire and Do wait their turn: among the waiters of the
	// key, across processes, the first to wait is the first served. A Fair
	// TryAcquire succeeds only when nobody waits. The order binds Fair
	// acquisitions only (a non-Fair Exclusive one may jump the line), so
	// give Fair to every acquirer of a key. It needs a backend whose
	// ModeSupport has Fair, else ErrUnsupported.
	Fair bool
}

// Mode says how a lock holds its key: Exclusive or Shared.
type Mode = backend.Mode

// The modes of AcquireOptions.Mode.
const (
	// Exclusive: the holder is alone on its key (the default).
	Exclusive = backend.Exclusive
	// Shared: many holders (or at most AcquireOptions.Limit) hold the key
	// at once; no Exclusive holder does.
	Shared = backend.Shared
)

// params is one acquisition's resolved configuration.
// Its fields are ordered so that the small ones share a word: a Lock
// carries one.
type params struct {
	ttl, renewDeadline, renewInterval, requestTimeout time.Duration
	maxHold, minHold                                  time.Duration
	metadata                                          map[string]string

	limit     int
	ancestors []string // backend keys of the ancestors, outermost first
	mode      Mode
	noRenew   bool
	hier      bool // AcquireOptions.Hierarchical
	fair      bool
}

// modes reports whether the acquisition needs backend.Modes.AcquireMode.
func (p *params) modes() bool { return p.mode != Exclusive || p.hier || p.fair }

// params resolves ao against the Locker's options.
func (l *Locker) params(ao *AcquireOptions) (params, error) {
	o := l.opts
	p := params{ttl: o.TTL, renewDeadline: o.RenewDeadline, renewInterval: o.RenewInterval, requestTimeout: o.RequestTimeout}
	if ao == nil {
		return p, nil
	}
	switch {
	case ao.TTL < 0:
		return p, fmt.Errorf("%w: AcquireOptions.TTL is negative (%v)", ErrInvalidOptions, ao.TTL)
	case ao.MaxHold < 0:
		return p, fmt.Errorf("%w: AcquireOptions.MaxHold is negative (%v)", ErrInvalidOptions, ao.MaxHold)
	case ao.MinHold < 0:
		return p, fmt.Errorf("%w: AcquireOptions.MinHold is negative (%v)", ErrInvalidOptions, ao.MinHold)
	case ao.MinHold > 0 && ao.NoRenew:
		return p, fmt.Errorf("%w: AcquireOptions.MinHold (%v) needs renewals: not with NoRenew", ErrInvalidOptions, ao.MinHold)
	case ao.MinHold > 0 && ao.MaxHold > 0 && ao.MinHold > ao.MaxHold:
		return p, fmt.Errorf("%w: AcquireOptions.MinHold (%v) exceeds MaxHold (%v)", ErrInvalidOptions, ao.MinHold, ao.MaxHold)
	case ao.Mode != Exclusive && ao.Mode != Shared:
		return p, fmt.Errorf("%w: AcquireOptions.Mode is unknown (%v)", ErrInvalidOptions, ao.Mode)
	case ao.Limit < 0:
		return p, fmt.Errorf("%w: AcquireOptions.Limit is negative (%d)", ErrInvalidOptions, ao.Limit)
	case ao.Limit > 0 && ao.Mode != Shared:
		return p, fmt.Errorf("%w: AcquireOptions.Limit (%d) is for Shared locks only", ErrInvalidOptions, ao.Limit)
	}
	p.noRenew, p.maxHold, p.minHold, p.metadata = ao.NoRenew, ao.MaxHold, ao.MinHold, maps.Clone(ao.Metadata)
	p.mode, p.limit, p.hier, p.fair = ao.Mode, ao.Limit, ao.Hierarchical, ao.Fair
	if ao.TTL != 0 && ao.TTL != o.TTL {
		scale := func(d time.Duration) time.Duration {
			return time.Duration(float64(d) / float64(o.TTL) * float64(ao.TTL))
		}
		s := Options{TTL: ao.TTL, RenewDeadline: scale(o.RenewDeadline), RenewInterval: scale(o.RenewInterval), RequestTimeout: scale(o.RequestTimeout)}
		if err := s.validate(l.b.MinTTL()); err != nil {
			return p, fmt.Errorf("AcquireOptions.TTL %v: %w", ao.TTL, err)
		}
		p.ttl, p.renewDeadline, p.renewInterval, p.requestTimeout = s.TTL, s.RenewDeadline, s.RenewInterval, s.RequestTimeout
	}
	return p, nil
}

// Locker acquires locks over one backend on behalf of one holder ID. Create
// it with New. All methods are safe for concurrent use.
type Locker struct {
	b       backend.Backend
	watcher backend.Watcher // nil when b cannot watch
	modes   backend.Modes   // nil when b has no shared locks, hierarchies or fair queueing
	id      string
	opts    Options
	log     *slog.Logger
	// metrics is false when opts.Metrics is NopMetrics (the default), so
	// that calls spare reading the clock for it.
	metrics bool

	// closeCtx is cancelled when Close begins: waits and calls in flight end.
	closeCtx    context.Context
	cancelClose context.CancelFunc
	// holdCtx is cancelled when Close has released every lock: background
	// release retries stop.
	holdCtx    context.Context
	cancelHold context.CancelFunc
	// tryBounds bounds TryAcquire's call by RequestTimeout when the
	// caller's context is never cancelled, with a context shared by the
	// calls of a slice of it and ended when Close begins; relBounds bounds
	// Release's likewise, and Close does not end those (it releases with
	// them). Neither costs a timer per call (keeper.Bounds).
	tryBounds, relBounds *keeper.Bounds

	mu      sync.Mutex // guards the fields below
	closed  bool
	closing chan struct{}        // closed when Close has finished; nil before Close
	locks   map[*Lock]struct{}   // locks handed out and not yet released
	queues  map[string]*keyQueue // local waiters per lock key
	// stopResets ends the reset watch (see watchResets); nil while it
	// does not run.
	stopResets context.CancelFunc
	// watchT runs watchTick, which starts the reset watch once a lock has
	// been held a quarter of its RenewInterval; armed at watchAt while
	// watchArmed.
	watchT     *time.Timer
	watchAt    time.Time
	watchArmed bool
	// tries cancels the TryAcquire calls in flight when Close begins, by
	// call number.
	tries  map[uint64]context.CancelFunc
	tryNum uint64

	ops      sync.WaitGroup // calls in flight, Do functions included
	monitors sync.WaitGroup // per started lock: its hold until finished; the watch timer while armed; the reset watch

	// pin keeps the keeper's renewal scheduler of the Locker's backend and
	// RenewInterval, so that short locks taken one after another share one
	// instead of making and dropping one each. Close unpins it; a cleanup
	// forgets it when a Locker that was never closed is collected.
	pin *keeper.Pin
}

// New returns a Locker that acquires locks on b as holder id (shown to
// others as the holder's ID; the lock itself is owned by a random token per
// acquisition, so two Lockers with the same id never share a lock). opts may
// be nil for defaults. New does no I/O; errors wrap ErrInvalidOptions.
func New(b backend.Backend, id string, opts *Options) (*Locker, error) {
	switch {
	case b == nil:
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidOptions)
	case id == "":
		return nil, fmt.Errorf("%w: empty holder ID", ErrInvalidOptions)
	}
	o, err := opts.withDefaults(b.MinTTL())
	if err != nil {
		return nil, err
	}
	l := &Locker{
		b:      b,
		id:     id,
		opts:   o,
		log:    o.Logger.With("locker", id),
		locks:  make(map[*Lock]struct{}),
		queues: make(map[string]*keyQueue),
		tries:  make(map[uint64]context.CancelFunc),
	}
	if keeper.NoRetryBudget(o.RenewInterval, o.RenewDeadline) {
		l.log.Warn("lock: a renewal that times out is not retried before the renew deadline: one slow reply loses the lock; "+
			"lower RenewInterval so that RenewInterval*5/4 < RenewDeadline",
			"renew_interval", o.RenewInterval, "renew_deadline", o.RenewDeadline)
	}
	_, nop := o.Metrics.(NopMetrics)
	l.metrics = !nop
	l.watcher, _ = b.(backend.Watcher)
	l.modes, _ = b.(backend.Modes)
	l.closeCtx, l.cancelClose = context.WithCancel(context.Background())
	l.holdCtx, l.cancelHold = context.WithCancel(context.Background())
	l.tryBounds = keeper.NewBounds(l.closeCtx, o.RequestTimeout)
	l.relBounds = keeper.NewBounds(context.Background(), o.RequestTimeout)
	l.pin = keeper.NewPin(b, o.RenewInterval)
	runtime.AddCleanup(l, (*keeper.Pin).Forget, l.pin)
	return l, nil
}

// ID returns the holder ID the Locker acquires as.
func (l *Locker) ID() string { return l.id }

// Options returns the options in effect, defaults applied.
func (l *Locker) Options() Options { return l.opts }

// Close cancels the context of every lock the Locker holds (cause matching
// ErrClosed), waits for every running Do and TryDo function to return and
// for calls in flight to end, releases every lock still held (owner-checked,
// each bounded by RequestTimeout), and waits for every goroutine the Locker
// started. Waiting Acquire, Do and WaitFree calls return an error wrapping
// ErrClosed. Close is idempotent and safe to call concurrently; later method
// calls return ErrClosed. It must not be called from a Do function, which it
// waits for.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closing != nil {
		closing := l.closing
		l.mu.Unlock()
		<-closing
		return nil
	}
	l.closing = make(chan struct{})
	l.closed = true
	locks := make([]*Lock, 0, len(l.locks))
	for lk := range l.locks {
		locks = append(locks, lk)
	}
	// The TryAcquire calls in flight are cancelled after closeCtx, which
	// they check to return ErrClosed rather than their context's error.
	tries := slices.Collect(maps.Values(l.tries))
	if l.watchArmed && l.watchT.Stop() {
		l.watchArmed = false
		l.monitors.Done()
	}
	l.mu.Unlock()

	l.cancelClose()
	for _, cancel := range tries {
		cancel()
	}
	for _, lk := range locks {
		lk.hold.Stop(newKeyError(lk.key, "cancelled: the locker was closed", nil, ErrClosed))
	}
	l.ops.Wait()
	l.mu.Lock()
	locks = locks[:0]
	for lk := range l.locks {
		locks = append(locks, lk)
	}
	l.mu.Unlock()
	releaseAll(locks)
	l.cancelHold()
	l.monitors.Wait()
	l.pin.Unpin()
	close(l.closing)
	return nil
}

// closeReleasers bounds the releases Close sends at once. A Locker holding
// many locks would otherwise send them all together: a store that serves a
// few thousand writes a second then answers most of them after their
// RequestTimeout, and each one that timed out is retried, so the flood
// feeds itself. A bounded number at a time keeps every release well within
// its timeout and costs nothing when there are few.
const closeReleasers = 128

// releaseAll releases locks, owner-checked, at most closeReleasers at once.
func releaseAll(locks []*Lock) {
	var wg sync.WaitGroup
	next := make(chan *Lock)
	for range min(len(locks), closeReleasers) {
		wg.Go(func() {
			for lk := range next {
				_ = lk.release(context.Background()) // at once, MinHold or not
			}
		})
	}
	for _, lk := range locks {
		next <- lk
	}
	close(next)
	wg.Wait()
}

// begin registers a call in flight and returns a context that also ends
// (with cause ErrClosed) when Close begins, and the function to call when
// the call returns.
func (l *Locker) begin(ctx context.Context) (context.Context, func(), error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, ErrClosed
	}
	l.ops.Add(1)
	l.mu.Unlock()
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.closeCtx, func() { cancel(ErrClosed) })
	return cctx, func() {
		stop()
		cancel(nil)
		l.ops.Done()
	}, nil
}

// beginRequest is begin for a call that makes one backend request: the
// context it returns also ends after RequestTimeout, and the function it
// returns ends both.
func (l *Locker) beginRequest(ctx context.Context) (context.Context, func(), error) {
	ctx, end, err := l.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.RequestTimeout)
	return ctx, func() {
		cancel()
		end()
	}, nil
}

// beginShared registers a single-attempt call in flight that Close ends
// through its context (one of l.tryBounds').
func (l *Locker) beginShared() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.ops.Add(1)
	return nil
}

// beginTry registers a single-attempt call in flight, to be cancelled with
// cancel when Close begins, and returns its number for endTry.
func (l *Locker) beginTry(cancel context.CancelFunc) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, ErrClosed
	}
	l.ops.Add(1)
	l.tryNum++
	l.tries[l.tryNum] = cancel
	return l.tryNum, nil
}

// endTry ends a call begun with beginTry.
func (l *Locker) endTry(id uint64) {
	l.mu.Lock()
	delete(l.tries, id)
	l.mu.Unlock()
	l.ops.Done()
}

// Key joins parts with "/" into a lock key: Key("tally", "42") is
// "tally/42". An empty part makes an empty segment, which every Locker method
// rejects with ErrInvalidKey.
func Key(parts ...string) string { return strings.Join(parts, "/") }

// checkKey validates a lock key and returns its backend key.
func (l *Locker) checkKey(key string) (string, error) {
	switch {
	case key == "":
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	case strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/") || strings.Contains(key, "//"):
		return "", fmt.Errorf("%w: %q has an empty segment", ErrInvalidKey, key)
	}
	bk := Prefix + key
	if err := l.b.ValidateKey(bk); err != nil {
		return "", fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
	}
	return bk, nil
}

// userRecord returns r with its key shown as a lock key.
func userRecord(r backend.Record) backend.Record {
	r.Key = strings.TrimPrefix(r.Key, Prefix)
	return r
}

// Holders returns the records of the holders of key, in term order: none
// when it is free, one for an exclusive lock, one per holder for a Shared
// lock (on a backend with backend.Modes). Records carry Mode and Limit, and
// their keys are lock keys. Locks below a hierarchical key are not its
// holders: list them with List.
func (l *Locker) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	bk, err := l.checkKey(key)
	if err != nil {
		return nil, err
	}
	ctx, end, err := l.beginRequest(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	if l.modes != nil {
		recs, err := l.modes.Holders(ctx, bk)
		if err != nil {
			return nil, fmt.Errorf("lock: holders of %q: %w", key, err)
		}
		for i := range recs {
			recs[i] = userRecord(recs[i])
		}
		return recs, nil
	}
	rec, err := l.b.Get(ctx, bk)
	switch {
	case errors.Is(err, backend.ErrNotHeld):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("lock: holders of %q: %w", key, err)
	}
	return []backend.Record{userRecord(rec)}, nil
}

// List returns the records of every held lock whose key begins with prefix
// (every held lock when prefix is empty), sorted by key: one record per
// holder, so a Shared lock appears once per holder, in term order. Record
// keys are lock keys, without the backend prefix. The prefix is matched as a
// string, not by levels: "alice" lists "alicex/edits/doc-9" too; give
// "alice/" to list one subject. Intents that hierarchical locks take on
// their ancestors are not holders and are not listed.
func (l *Locker) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	ctx, end, err := l.beginRequest(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	recs, err := l.b.List(ctx, Prefix+prefix)
	if err != nil {
		return nil, fmt.Errorf("lock: list %q: %w", prefix, err)
	}
	for i := range recs {
		recs[i] = userRecord(recs[i])
	}
	return recs, nil
}

// SubjectStats counts the locks held under one subject: the first segment
// of their keys, up to the first "/" or ":" (as DefaultClass).
type SubjectStats struct {
	// Subject is the keys' first segment.
	Subject string
	// Keys is the number of distinct keys held.
	Keys int
	// Held is the number of holders: Shared plus Exclusive.
	Held int
	// Shared is the number of Shared holders (a Shared key counts each).
	Shared int
	// Exclusive is the number of Exclusive holders.
	Exclusive int
	// Oldest is the record of the holder that acquired first, by the
	// store's clock (AcquiredAt); its key is a lock key.
	Oldest backend.Record
}

// Stats returns per-subject counts of the locks held whose keys begin with
// prefix (every lock when prefix is empty), sorted by subject: one List
// call, for dashboards ("3 consolidation locks, 2 of them shared, the
// oldest held by alice since 10:02"). The prefix is matched as List matches
// it, as a string.
func (l *Locker) Stats(ctx context.Context, prefix string) ([]SubjectStats, error) {
	recs, err := l.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("lock: stats %q: %w", prefix, err)
	}
	var out []SubjectStats
	idx := make(map[string]int)
	lastKey := make(map[string]string)
	for _, r := range recs {
		subj := DefaultClass(r.Key)
		i, ok := idx[subj]
		if !ok {
			i = len(out)
			idx[subj] = i
			out = append(out, SubjectStats{Subject: subj, Oldest: r})
		}
		s := &out[i]
		if s.Keys == 0 || lastKey[subj] != r.Key {
			s.Keys++
			lastKey[subj] = r.Key
		}
		s.Held++
		if r.Mode == Shared {
			s.Shared++
		} else {
			s.Exclusive++
		}
		if r.AcquiredAt.Before(s.Oldest.AcquiredAt) {
			s.Oldest = r
		}
	}
	slices.SortFunc(out, func(a, b SubjectStats) int { return strings.Compare(a.Subject, b.Subject) })
	return out, nil
}
