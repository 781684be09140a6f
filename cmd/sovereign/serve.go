package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

//go:embed static
var static embed.FS

// stringList collects a repeated string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func cmdServe(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "serve", "serve [--http :4040] [--prefix P] [--election NAME]...")
	addr := fs.String("http", ":4040", "listen `address`")
	prefix := fs.String("prefix", "", "show the elections and locks whose name begins with `P`")
	var names stringList
	fs.Var(&names, "election", "always show election `NAME`, even while nobody holds it (repeatable; lock/KEY for a lock)")
	interval := fs.Duration("interval", time.Second, "read the backend at least this often: new elections under the prefix appear at the next read, changes of those shown arrive at once through the backend's watch")
	forget := fs.Duration("forget", 10*time.Minute, "stop showing an election nobody has held for this long")
	demo := fs.Bool("demo", false, "with memory://: run demo candidates in this process, so the page has something to show")
	if _, err := exactArgs(fs, args, 0, 0); err != nil {
		return err
	}
	if *interval <= 0 || *forget <= 0 {
		return usageError("--interval and --forget must be positive")
	}
	b, err := env.open()
	if err != nil {
		return err
	}
	defer b.Close()
	for _, n := range names {
		if err := b.ValidateKey(n); err != nil {
			return exitWith(exitUsage, err)
		}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(env.stderr, nil))
	if *demo {
		stopDemo, err := startDemo(ctx, b.Backend, *prefix)
		if err != nil {
			return exitWith(exitUsage, err)
		}
		defer stopDemo()
	}
	s := newServer(b.Backend, serverOptions{
		label:    b.redacted,
		prefix:   *prefix,
		names:    names,
		interval: *interval,
		forget:   *forget,
		timeout:  env.backend.commandTimeout,
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return exitWith(exitUsage, fmt.Errorf("--http: %w", err))
	}
	fmt.Fprintf(env.stderr, "sovereign: serving the status of %s on http://%s/\n", b.redacted, ln.Addr())
	return s.serve(ctx, ln, log)
}

// serverOptions configure a server.
type serverOptions struct {
	label    string        // the backend, for display (no password)
	prefix   string        // names shown begin with it
	names    []string      // keys always shown
	interval time.Duration // the longest time between two reads
	forget   time.Duration // how long a free key stays on the page
	timeout  time.Duration // bound on each read
}

// server reads the backend and serves the status page, its event stream,
// /healthz and /metrics.
type server struct {
	b       backend.Backend
	watcher backend.Watcher // nil when b cannot watch
	o       serverOptions

	poke chan struct{} // capacity 1: read the backend now

	mu      sync.Mutex // guards the fields below
	snap    snapshot
	data    []byte // snap as JSON
	known   map[string]*known
	subs    map[chan []byte]struct{}
	watches sync.WaitGroup
}

// known is what the server remembers of a key it has seen.
type known struct {
	lastHeld time.Time
	term     uint64
	fullTTL  time.Duration // the longest TTL seen for term: the TTL bar's length
	stop     context.CancelFunc
}

// snapshot is what the page shows: everything read in one refresh.
type snapshot struct {
	Time    time.Time `json:"time"`
	Backend string    `json:"backend"`
	Prefix  string    `json:"prefix"`
	OK      bool      `json:"ok"`
	Error   string    `json:"error,omitempty"`
	// LastOK is when the backend last answered.
	LastOK  *time.Time `json:"last_ok,omitempty"`
	Entries []entry    `json:"entries"`
}

func newServer(b backend.Backend, o serverOptions) *server {
	s := &server{
		b:     b,
		o:     o,
		poke:  make(chan struct{}, 1),
		known: make(map[string]*known),
		subs:  make(map[chan []byte]struct{}),
	}
	s.watcher, _ = b.(backend.Watcher)
	s.snap = snapshot{Backend: o.label, Prefix: o.prefix, Entries: []entry{}, Error: "not read yet"}
	s.data, _ = json.Marshal(s.snap)
	return s
}

// serve reads the backend and serves HTTP on ln until ctx ends.
func (s *server) serve(ctx context.Context, ln net.Listener, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { s.run(ctx) })
	hs := &http.Server{
		Handler:           s.handler(),
		BaseContext:       func(net.Listener) context.Context { return ctx }, // ends the event streams
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = hs.Shutdown(sctx)
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// run refreshes the snapshot every interval and whenever a watch reports a
// change, until ctx ends; then it stops every watch.
func (s *server) run(ctx context.Context) {
	defer func() {
		s.mu.Lock()
		for _, k := range s.known {
			if k.stop != nil {
				k.stop()
			}
		}
		s.mu.Unlock()
		s.watches.Wait()
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.poke:
		case <-t.C:
		}
		s.refresh(ctx)
		t.Reset(s.o.interval)
	}
}

// refresh reads every key under the prefix, and every key shown before,
// and publishes the new snapshot.
func (s *server) refresh(ctx context.Context) {
	now := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.o.timeout)
	defer cancel()
	recs, err := listBoth(rctx, s.b, s.o.prefix)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.snap.Time, s.snap.OK, s.snap.Error = now, false, err.Error()
		s.publishLocked()
		s.mu.Unlock()
		return
	}
	// held maps each key to its oldest holder's record, all to every
	// holder's (List gives one record per live holder of a shared key, in
	// term order within the key).
	held := make(map[string]*backend.Record, len(recs))
	all := make(map[string][]backend.Record, len(recs))
	for i := range recs {
		if held[recs[i].Key] == nil {
			held[recs[i].Key] = &recs[i]
		}
		all[recs[i].Key] = append(all[recs[i].Key], recs[i])
	}
	s.mu.Lock()
	for _, n := range s.o.names {
		if _, ok := s.known[n]; !ok {
			s.known[n] = &known{}
		}
	}
	for key := range held {
		if _, ok := s.known[key]; !ok {
			s.known[key] = &known{}
		}
	}
	keys := make([]string, 0, len(s.known))
	for key := range s.known {
		keys = append(keys, key)
	}
	s.mu.Unlock()

	entries := make([]entry, 0, len(keys))
	for _, key := range keys {
		rec := held[key]
		members, err := s.b.Members(rctx, key)
		if err != nil {
			members = nil
		}
		s.mu.Lock()
		k := s.known[key]
		if rec != nil {
			k.lastHeld = now
			if rec.Term != k.term {
				k.term, k.fullTTL = rec.Term, rec.TTL
			}
			k.fullTTL = max(k.fullTTL, rec.TTL)
		} else if !k.lastHeld.IsZero() && now.Sub(k.lastHeld) > s.o.forget && !contains(s.o.names, key) {
			if k.stop != nil {
				k.stop()
			}
			delete(s.known, key)
			s.mu.Unlock()
			continue
		}
		if k.stop == nil && s.watcher != nil {
			wctx, stop := context.WithCancel(ctx)
			k.stop = stop
			s.watches.Go(func() { watchLoop(wctx, s.watcher, key, s.poke) })
		}
		e := newEntry(key, rec, members)
		e.setHolders(all[key])
		if rec != nil {
			e.FullTTLSeconds = ms(k.fullTTL)
			e.warn(k.fullTTL)
		}
		s.mu.Unlock()
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Kind != entries[j].Kind {
			return entries[i].Kind == "election"
		}
		return entries[i].Name < entries[j].Name
	})
	s.mu.Lock()
	s.snap = snapshot{Time: now, Backend: s.o.label, Prefix: s.o.prefix, OK: true, LastOK: &now, Entries: entries}
	s.publishLocked()
	s.mu.Unlock()
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// publishLocked encodes the snapshot and hands it to every event stream,
// replacing one a slow stream has not taken yet.
func (s *server) publishLocked() {
	if !s.snap.OK && s.snap.LastOK == nil && s.snap.Error == "" {
		s.snap.Error = "not read yet"
	}
	data, err := json.Marshal(s.snap)
	if err != nil {
		return
	}
	s.data = data
	for ch := range s.subs {
		select {
		case <-ch:
		default:
		}
		ch <- data
	}
}

// subscribe returns a channel that receives every new snapshot (the latest
// one when the reader falls behind), starting with the current one.
func (s *server) subscribe() (<-chan []byte, func()) {
	ch := make(chan []byte, 1)
	s.mu.Lock()
	ch <- s.data
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}
}

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	mux.Handle("GET /", http.FileServerFS(sub))
	mux.HandleFunc("GET /api/state", s.state)
	mux.HandleFunc("GET /events", s.events)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /metrics", s.metrics)
	return mux
}

func (s *server) state(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	data := s.data
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(data)
}

// events streams snapshots as server-sent events until the client goes
// away or the server stops.
func (s *server) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	ch, unsubscribe := s.subscribe()
	defer unsubscribe()
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	fmt.Fprint(w, "retry: 1000\n\n")
	for {
		select {
		case <-r.Context().Done():
			return
		case data := <-ch:
			if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
				return
			}
		case <-ping.C:
			if _, err := io.WriteString(w, ": ping\n\n"); err != nil {
				return
			}
		}
		flusher.Flush()
	}
}

// healthz answers 200 when the last read of the backend succeeded and is
// recent, 503 otherwise.
func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	snap := s.snap
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	stale := 3*s.o.interval + s.o.timeout
	switch {
	case !snap.OK:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "backend unreachable: %s\n", snap.Error)
	case time.Since(snap.Time) > stale:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "no read of the backend for %s\n", round(time.Since(snap.Time)))
	default:
		fmt.Fprintf(w, "ok\n")
	}
}

// metrics writes the Prometheus text exposition format by hand.
func (s *server) metrics(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	snap := s.snap
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	var b strings.Builder
	family := func(name, typ, help string, sample func(e entry) (float64, bool)) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, e := range snap.Entries {
			if v, ok := sample(e); ok {
				fmt.Fprintf(&b, "%s{name=%s,kind=%s} %s\n", name, label(e.Name), label(e.Kind), strconv.FormatFloat(v, 'g', -1, 64))
			}
		}
	}
	up := 0.0
	if snap.OK {
		up = 1
	}
	fmt.Fprintf(&b, "# HELP sovereign_up Whether the last read of the backend succeeded.\n# TYPE sovereign_up gauge\nsovereign_up %g\n", up)
	family("sovereign_election_held", "gauge", "Whether the election or lock has a holder (1) or not (0).", func(e entry) (float64, bool) {
		if e.Held {
			return 1, true
		}
		return 0, true
	})
	family("sovereign_election_ttl_seconds", "gauge", "Time the holder's lease has left, in seconds.", func(e entry) (float64, bool) {
		return e.TTLSeconds, e.Held
	})
	family("sovereign_election_term", "gauge", "Fencing term of the current holder.", func(e entry) (float64, bool) {
		return float64(e.Term), e.Held
	})
	family("sovereign_election_members", "gauge", "Number of instances with a live heartbeat.", func(e entry) (float64, bool) {
		return float64(len(e.Members)), true
	})
	family("sovereign_election_holders", "gauge", "Number of live holders of the election or lock (more than 1 for a shared lock).", func(e entry) (float64, bool) {
		return float64(len(e.Holders)), true
	})
	fmt.Fprintf(&b, "# HELP sovereign_election_holder_info The current holder, as a label: one series per holder of a shared lock.\n# TYPE sovereign_election_holder_info gauge\n")
	for _, e := range snap.Entries {
		switch {
		case len(e.Holders) > 0:
			for _, h := range e.Holders {
				fmt.Fprintf(&b, "sovereign_election_holder_info{name=%s,kind=%s,holder=%s} 1\n", label(e.Name), label(e.Kind), label(h.ID))
			}
		case e.Held:
			fmt.Fprintf(&b, "sovereign_election_holder_info{name=%s,kind=%s,holder=%s} 1\n", label(e.Name), label(e.Kind), label(e.Holder))
		}
	}
	io.WriteString(w, b.String())
}

// label quotes a Prometheus label value.
func label(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(v) + `"`
}
