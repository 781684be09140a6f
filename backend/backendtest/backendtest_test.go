package backendtest_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// brokenEnvVar names the environment variable that selects a broken backend in
// the child process of TestSuiteCatchesBrokenBackends.
const brokenEnvVar = "BACKENDTEST_BROKEN"

// broken wraps a memory backend client and breaks one promise of the
// contract, the one its name says (none when the name is "none").
type broken struct {
	backend.Backend
	w      backend.Watcher
	name   string
	sh     *shared
	closed atomic.Bool // Close was called
}

// shared is what the broken clients of one store remember between calls, so
// that a mutation can show state the store no longer has.
type shared struct {
	mu        sync.Mutex
	ever      map[string]bool           // every key acquired
	live      map[string]backend.Record // leases acquired and not released, by key
	released  map[string]backend.Record // leases released, by key
	beats     map[string]bool           // "key:heartbeat:id" of every heartbeat
	counters  map[string]uint64         // per-key term counters ("term-counter-forgotten")
	ancestors map[string]bool           // every key named as an ancestor in AcquireMode
	waitIDs   map[string]bool           // "key/waitID" of every registration attempt
}

func newShared() *shared {
	return &shared{
		ever:      map[string]bool{},
		live:      map[string]backend.Record{},
		released:  map[string]backend.Record{},
		beats:     map[string]bool{},
		counters:  map[string]uint64{},
		ancestors: map[string]bool{},
		waitIDs:   map[string]bool{},
	}
}

// mutations maps the name of each broken backend to the subtests that must
// catch it. ConcurrentUse has no entry: what it catches (data races, a
// non-atomic acquire under contention) shows only under -race or with a
// lucky interleaving, so no mutation fails it every time.
var mutations = map[string][]string{
	"blind-overwrite":              {"AcquireIsAtomic"},
	"renew-ignores-owner":          {"RenewAndReleaseAreOwnerChecked"},
	"release-ignores-owner":        {"RenewAndReleaseAreOwnerChecked"},
	"renew-after-release":          {"LeaseLostAfterRelease"},
	"renew-resurrects-expired":     {"LeaseLostAfterExpiry", "RestartLosingData"},
	"constant-term":                {"TermsStrictlyIncrease"},
	"renew-does-nothing":           {"RenewExtends"},
	"no-holder-heartbeat":          {"Record"},
	"members-unsorted":             {"HeartbeatsAndMembers"},
	"get-free-no-error":            {"GetFreeKey"},
	"watch-drops-release":          {"Watch"},
	"notify-never":                 {"WatchNotify"},
	"notify-once":                  {"WatchNotify"},
	"notify-not-on-close":          {"WatchNotify"},
	"ignores-cancel":               {"CancelledContext"},
	"close-does-nothing":           {"Closed"},
	"metadata-dropped":             {"Record"},
	"short-ttl-granted":            {"LeaseExpires"},
	"expires-early":                {"LeaseExpires"},
	"held-error-wrong-holder":      {"HeldErrorNamesHolder"},
	"same-id-reenters":             {"SameHolderIDDifferentToken"},
	"get-accepts-empty-key":        {"InvalidArguments"},
	"setmetadata-skips-validation": {"InvalidArguments"},
	"list-ignores-cancel":          {"CancelledContext"},
	"setmetadata-ignores-owner":    {"SetMetadata"},
	"setmetadata-extends":          {"SetMetadata"},
	"setmetadata-merges":           {"SetMetadata"},
	"setmetadata-noop":             {"SetMetadata"},
	"list-unsorted":                {"List"},
	"list-ignores-prefix":          {"List"},
	"list-drops-metadata":          {"List"},
	"list-empty-prefix-lists-none": {"List"},
	"list-key-cut-at-colon":        {"List"},
	"list-prefix-is-glob":          {"ListPrefixIsLiteral"},
	"list-includes-heartbeats":     {"ListOnlyLiveLeases"},
	"list-includes-released":       {"ListOnlyLiveLeases"},
	"list-includes-expired":        {"ListOnlyLiveLeases"},
	"validatekey-accepts-empty":    {"ValidateKey"},
	"validatekey-rejects-colon":    {"ValidateKey"},
	"min-ttl-zero":                 {"MinTTL"},
	"min-ttl-refused":              {"MinTTL"},
	"takeover-without-heartbeat":   {"NoTakeover"},
	"size-counts-nothing":          {"BoundedState"},
	"keeps-term-counters":          {"BoundedState"},
	"keeps-heartbeat-records":      {"BoundedState"},
	"term-counter-forgotten":       {"BoundedState"},
	"restart-loses-kept-data":      {"RestartKeepingData"},
	"watch-survives-restart":       {"RestartLosingData"},
	"watch-silent-after-restart":   {"RestartKeepingData", "RestartLosingData"},
	"terms-reset-on-restart":       {"RestartLosingData"},
}

func (b *broken) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	ctx = b.ctx(ctx)
	granted := req.TTL
	switch b.name {
	case "metadata-dropped":
		req.Metadata = nil
	case "expires-early":
		req.TTL /= 4
	case "min-ttl-refused":
		if req.TTL < 10*time.Millisecond {
			return backend.Lease{}, fmt.Errorf("%w: TTL %v below 10ms", backend.ErrInvalid, req.TTL)
		}
	}
	l, err := b.acquire(ctx, req)
	l.TTL = max(l.TTL, granted)
	var held *backend.HeldError
	switch {
	case b.name == "same-id-reenters" && errors.As(err, &held) && held.Holder.HolderID == req.HolderID:
		return b.overwrite(ctx, req, held.Holder)
	case b.name == "held-error-wrong-holder" && errors.As(err, &held):
		held.Holder.HolderID = "someone-else"
	case b.name == "blind-overwrite" && errors.As(err, &held):
		return b.overwrite(ctx, req, held.Holder)
	case b.name == "takeover-without-heartbeat" && errors.As(err, &held) && !held.Holder.HasHeartbeat():
		return b.overwrite(ctx, req, held.Holder)
	case b.name == "constant-term":
		l.Term = 1
	case b.name == "short-ttl-granted":
		l.TTL = req.TTL / 2
	}
	return l, err
}

// acquire acquires through the memory client and records the lease in the
// shared state.
func (b *broken) acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	l, err := b.Backend.Acquire(ctx, req)
	if err != nil {
		return l, err
	}
	b.sh.mu.Lock()
	defer b.sh.mu.Unlock()
	b.sh.ever[l.Key] = true
	b.sh.live[l.Key] = backend.Record{Key: l.Key, HolderID: l.HolderID, Token: l.Token, Term: l.Term, TTL: l.TTL, Metadata: maps.Clone(req.Metadata)}
	if b.name == "term-counter-forgotten" {
		b.sh.counters[l.Key]++
		l.Term = b.sh.counters[l.Key]
	}
	return l, nil
}

// overwrite removes the holder's lease (using the token its record shows)
// and acquires in its place: what a backend without an atomic acquire does.
func (b *broken) overwrite(ctx context.Context, req backend.AcquireRequest, holder backend.Record) (backend.Lease, error) {
	_ = b.Backend.Release(ctx, backend.Lease{Key: holder.Key, HolderID: holder.HolderID, Token: holder.Token, Term: holder.Term, TTL: req.TTL})
	return b.acquire(ctx, req)
}

func (b *broken) Renew(ctx context.Context, l backend.Lease) error {
	switch b.name {
	case "renew-does-nothing":
		return nil
	case "renew-resurrects-expired":
		if _, err := b.Backend.Get(ctx, l.Key); errors.Is(err, backend.ErrNotHeld) {
			_, err := b.Backend.Acquire(ctx, backend.AcquireRequest{Key: l.Key, HolderID: l.HolderID, TTL: l.TTL})
			return err
		}
	}
	err := b.Backend.Renew(b.ctx(ctx), l)
	switch {
	case b.name == "renew-ignores-owner" && errors.Is(err, backend.ErrLeaseLost):
		return nil
	case b.name == "renew-after-release" && errors.Is(err, backend.ErrLeaseLost):
		if _, gerr := b.Backend.Get(ctx, l.Key); errors.Is(gerr, backend.ErrNotHeld) {
			return nil
		}
	}
	return err
}

func (b *broken) Release(ctx context.Context, l backend.Lease) error {
	err := b.Backend.Release(b.ctx(ctx), l)
	if b.name == "release-ignores-owner" && errors.Is(err, backend.ErrLeaseLost) {
		if rec, gerr := b.Backend.Get(ctx, l.Key); gerr == nil {
			return b.Backend.Release(ctx, backend.Lease{Key: rec.Key, HolderID: rec.HolderID, Token: rec.Token, Term: rec.Term, TTL: time.Second})
		}
	}
	if err == nil {
		b.sh.mu.Lock()
		b.sh.released[l.Key] = b.sh.live[l.Key]
		delete(b.sh.live, l.Key)
		b.sh.mu.Unlock()
	}
	return err
}

func (b *broken) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	switch b.name {
	case "setmetadata-noop":
		return nil
	case "setmetadata-skips-validation":
		if l.Token == "" {
			return fmt.Errorf("no such lease: %w", backend.ErrLeaseLost)
		}
	case "setmetadata-merges":
		if rec, err := b.Backend.Get(ctx, l.Key); err == nil && rec.Token == l.Token {
			merged := maps.Clone(rec.Metadata)
			if merged == nil {
				merged = map[string]string{}
			}
			maps.Copy(merged, md)
			md = merged
		}
	}
	err := b.Backend.SetMetadata(b.ctx(ctx), l, md)
	switch {
	case b.name == "setmetadata-ignores-owner" && errors.Is(err, backend.ErrLeaseLost):
		if rec, gerr := b.Backend.Get(ctx, l.Key); gerr == nil {
			return b.Backend.SetMetadata(ctx, backend.Lease{Key: rec.Key, HolderID: rec.HolderID, Token: rec.Token, Term: rec.Term, TTL: time.Second}, md)
		}
	case b.name == "setmetadata-extends" && err == nil:
		return b.Backend.Renew(ctx, l)
	}
	return err
}

func (b *broken) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	query := prefix
	switch b.name {
	case "list-ignores-cancel":
		ctx = context.WithoutCancel(ctx)
	case "list-empty-prefix-lists-none":
		if prefix == "" {
			return nil, nil
		}
	case "list-ignores-prefix", "list-prefix-is-glob":
		query = ""
	}
	recs, err := b.Backend.List(b.ctx(ctx), query)
	if err != nil {
		return recs, err
	}
	listed := func(key string) bool {
		return slices.ContainsFunc(recs, func(r backend.Record) bool { return r.Key == key })
	}
	b.sh.mu.Lock()
	defer b.sh.mu.Unlock()
	switch b.name {
	case "list-prefix-is-glob": // what a SCAN MATCH prefix* with an unescaped prefix does
		recs = slices.DeleteFunc(recs, func(r backend.Record) bool {
			ok, _ := path.Match(prefix+"*", r.Key)
			return !ok
		})
	case "list-unsorted":
		slices.Reverse(recs)
	case "list-drops-metadata":
		for i := range recs {
			recs[i].Metadata = nil
		}
	case "list-key-cut-at-colon": // a key parsed back from a store key by its last ":"
		for i, r := range recs {
			if j := strings.LastIndex(r.Key, ":"); j >= 0 {
				recs[i].Key = r.Key[:j]
			}
		}
	case "list-includes-heartbeats":
		for k := range b.sh.beats {
			if strings.HasPrefix(k, prefix) {
				recs = append(recs, backend.Record{Key: k})
			}
		}
	case "list-includes-released":
		for k, r := range b.sh.released {
			if strings.HasPrefix(k, prefix) && !listed(k) {
				recs = append(recs, r)
			}
		}
	case "list-includes-expired":
		for k, r := range b.sh.live {
			if strings.HasPrefix(k, prefix) && !listed(k) {
				recs = append(recs, r)
			}
		}
	}
	if strings.HasPrefix(b.name, "list-includes-") {
		slices.SortFunc(recs, func(a, b backend.Record) int { return strings.Compare(a.Key, b.Key) })
	}
	return recs, nil
}

func (b *broken) ValidateKey(key string) error {
	switch {
	case b.name == "validatekey-accepts-empty" && key == "":
		return nil
	case b.name == "validatekey-rejects-colon" && strings.Contains(key, ":"):
		return fmt.Errorf("%w: %q contains a colon", backend.ErrInvalid, key)
	}
	return b.Backend.ValidateKey(key)
}

func (b *broken) MinTTL() time.Duration {
	if b.name == "min-ttl-zero" {
		return 0
	}
	return b.Backend.MinTTL()
}

func (b *broken) Get(ctx context.Context, key string) (backend.Record, error) {
	if b.name == "get-accepts-empty-key" && key == "" {
		return backend.Record{}, backend.ErrNotHeld
	}
	rec, err := b.Backend.Get(b.ctx(ctx), key)
	switch {
	case b.name == "no-holder-heartbeat":
		rec.HeartbeatAt, rec.HeartbeatAge = time.Time{}, 0
	case b.name == "constant-term":
		rec.Term = 1
	case b.name == "get-free-no-error" && errors.Is(err, backend.ErrNotHeld):
		return backend.Record{Key: key}, nil
	}
	return rec, err
}

func (b *broken) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	err := b.Backend.Heartbeat(b.ctx(ctx), key, id, ttl)
	if err == nil {
		b.sh.mu.Lock()
		b.sh.beats[key+":heartbeat:"+id] = true
		b.sh.mu.Unlock()
	}
	return err
}

func (b *broken) Members(ctx context.Context, key string) ([]backend.Member, error) {
	ms, err := b.Backend.Members(b.ctx(ctx), key)
	if b.name == "members-unsorted" {
		slices.Reverse(ms)
	}
	return ms, err
}

func (b *broken) RemoveMember(ctx context.Context, key, id string) error {
	return b.Backend.RemoveMember(b.ctx(ctx), key, id)
}

func (b *broken) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	ch, err := b.w.Watch(b.ctx(ctx), key)
	if err == nil && b.name == "watch-survives-restart" {
		return b.resubscribe(ctx, key, ch), nil
	}
	if err == nil && b.name == "watch-silent-after-restart" {
		return silence(ctx, ch), nil
	}
	if err != nil || b.name != "watch-drops-release" {
		return ch, err
	}
	out := make(chan backend.Event, 16)
	go func() {
		defer close(out)
		for e := range ch {
			if e.Type == backend.EventChanged {
				out <- e
			}
		}
	}()
	return out, nil
}

// WatchNotify is the broken Watch, notified, for the mutations of Watch;
// otherwise the memory store's WatchNotify, with the notify calls the
// mutations named notify-* leave out: every one (notify-never), every one
// after the first (notify-once), those after the channel was closed by the
// end of ctx or by Close (notify-not-on-close).
func (b *broken) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	switch b.name {
	case "watch-drops-release", "watch-survives-restart", "watch-silent-after-restart":
		// The broken Watch, with notifications of what it delivers.
		ch, err := b.Watch(ctx, key)
		if err != nil {
			return nil, err
		}
		out := make(chan backend.Event, 16)
		go func() {
			defer notify()
			defer close(out)
			for e := range ch {
				select {
				case out <- e:
				default:
				}
				notify()
			}
		}()
		return out, nil
	}
	var calls atomic.Int64
	inner := func() {
		n := calls.Add(1)
		switch {
		case b.name == "notify-never",
			b.name == "notify-once" && n > 1,
			b.name == "notify-not-on-close" && (ctx.Err() != nil || b.closed.Load()):
			return
		}
		notify()
	}
	return b.w.(backend.WatchNotifier).WatchNotify(b.ctx(ctx), key, inner)
}

// resubscribe forwards the events of ch and, when ch closes while ctx is
// alive, silently watches again: what a backend does that reconnects its
// subscription without telling the receiver it may have missed changes.
func (b *broken) resubscribe(ctx context.Context, key string, ch <-chan backend.Event) <-chan backend.Event {
	out := make(chan backend.Event, 16)
	go func() {
		defer close(out)
		for {
			for e := range ch {
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
			if ctx.Err() != nil {
				return
			}
			var err error
			if ch, err = b.w.Watch(ctx, key); err != nil {
				return
			}
		}
	}()
	return out
}

// silence forwards the events of ch and, when ch closes while ctx is alive,
// keeps its own channel open without ever delivering another event: a
// subscription that broke without anyone noticing.
func silence(ctx context.Context, ch <-chan backend.Event) <-chan backend.Event {
	out := make(chan backend.Event, 16)
	go func() {
		defer close(out)
		for e := range ch {
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
		<-ctx.Done()
	}()
	return out
}

func (b *broken) Close() error {
	if b.name == "close-does-nothing" {
		return nil
	}
	b.closed.Store(true)
	return b.Backend.Close()
}

func (b *broken) ctx(ctx context.Context) context.Context {
	if b.name == "ignores-cancel" {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// TestBrokenChild runs the suite against the broken backend named by
// $BACKENDTEST_BROKEN; it is a child process of
// TestSuiteCatchesBrokenBackends and skips when run directly.
func TestBrokenChild(t *testing.T) {
	name := os.Getenv(brokenEnvVar)
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenBackends")
	}
	backendtest.Run(t, func(t *testing.T) backendtest.Env { return brokenEnv(t, name) })
}

// brokenEnv is the Env of a store whose clients are broken as name says;
// for some names the Env's own hooks are what is broken.
func brokenEnv(t *testing.T, name string) backendtest.Env {
	store := memorybackend.NewStore()
	sh := newShared()
	env := backendtest.Env{
		Open: func() backend.Backend {
			c := store.Client()
			return &broken{Backend: c, w: c, name: name, sh: sh}
		},
		ShortTTL: 200 * time.Millisecond,
		Size:     store.Len,
		Restart: func(loseData bool) {
			store.Restart(&memorybackend.RestartOptions{KeepLeases: !loseData})
		},
		TermsSurviveDataLoss: true,
	}
	if _, ok := modeMutations[name]; ok || name == "modes-none" {
		env.Open = func() backend.Backend {
			c := store.Client()
			if name == "ancestor-waiters-ignored" {
				ms := c.ModeSupport()
				ms.AncestorWaiters = false
				c.SetModeSupport(ms)
			}
			return &brokenModes{Backend: c, name: name, sh: sh}
		}
	}
	count := func(m map[string]bool) int {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return len(m)
	}
	switch name {
	case "size-counts-nothing":
		env.Size = func() int { return 0 }
	case "keeps-term-counters": // the memory store before it had a store-wide counter
		env.Size = func() int { return store.Len() + count(sh.ever) }
	case "keeps-heartbeat-records":
		env.Size = func() int { return store.Len() + count(sh.beats) }
	case "restart-keeps-entries": // a restart with persistence, reported as one without
		env.Restart = func(bool) { store.Restart(&memorybackend.RestartOptions{KeepLeases: true}) }
	case "keeps-wait-ids":
		env.Size = func() int { return store.Len() + count(sh.waitIDs) }
	case "term-counter-forgotten": // per-key counters, dropped with the key's state
		probe := store.Client()
		t.Cleanup(func() { _ = probe.Close() })
		env.Size = func() int {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			for k := range sh.counters {
				if _, err := probe.Get(context.Background(), k); errors.Is(err, backend.ErrNotHeld) {
					delete(sh.counters, k)
				}
			}
			return store.Len() + len(sh.counters)
		}
	case "restart-loses-kept-data":
		env.Restart = func(bool) { store.Restart(nil) }
	case "terms-reset-on-restart":
		env.Restart = func(loseData bool) {
			store.Restart(&memorybackend.RestartOptions{KeepLeases: !loseData, LoseTerms: true})
		}
	}
	return env
}

// TestSuiteCatchesBrokenBackends checks that each subtest fails for a backend
// that breaks the promise it tests.
func TestSuiteCatchesBrokenBackends(t *testing.T) {
	if os.Getenv(brokenEnvVar) != "" {
		t.Skip("child process")
	}
	// The children run childProcs at a time, more than t.Parallel's default
	// of GOMAXPROCS: most of them spend their time waiting out a bound for
	// a state that never comes.
	const childProcs = 6
	type child struct {
		name, subtest string
		out           []byte
		err           error
	}
	var children []*child
	for name, subtests := range mutations {
		for _, subtest := range subtests {
			children = append(children, &child{name: name, subtest: subtest})
		}
	}
	slices.SortFunc(children, func(a, b *child) int { return strings.Compare(a.name+"/"+a.subtest, b.name+"/"+b.subtest) })
	sem := make(chan struct{}, childProcs)
	var wg sync.WaitGroup
	for _, c := range children {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenChild$/^"+c.subtest+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnvVar+"="+c.name)
			c.out, c.err = cmd.CombinedOutput()
		})
	}
	wg.Wait()
	for _, c := range children {
		t.Run(c.name+"/"+c.subtest, func(t *testing.T) {
			if c.err == nil {
				t.Fatalf("subtest %s passed against a backend with %q, want a failure\n%s", c.subtest, c.name, c.out)
			}
			if want := "--- FAIL: TestBrokenChild/" + c.subtest + " "; !strings.Contains(string(c.out), want) {
				t.Fatalf("output: got\n%s\nwant a line %q", c.out, want)
			}
		})
	}
}

// TestSuitePassesUnbrokenWrapper makes sure the wrapper itself keeps the
// contract when nothing is broken, so the failures above come from the
// mutation alone.
func TestSuitePassesUnbrokenWrapper(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backendtest.Env { return brokenEnv(t, "none") })
}
