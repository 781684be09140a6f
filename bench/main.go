// Command bench measures Sovereign against the election and lock libraries
// people use today, on servers it starts itself: a redis-server on a free
// loopback port and an embedded etcd. It prints one markdown table, each
// figure the median of several interleaved runs. See README.md.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// config is what the flags select.
type config struct {
	only         map[string]bool
	cpuProfile   string
	rounds       int
	handoverN    int
	crashN       int
	ttl          time.Duration
	idleSettle   time.Duration
	idleWindow   time.Duration
	idleTTLs     []time.Duration
	idleCadence  string
	many         []manySpec
	manyTTL      time.Duration
	manyJitter   time.Duration
	manyInflight int
	manyDiag     bool
	diagDir      string
	plots        string
	manyBound    time.Duration
	manySettle   time.Duration
	manyWindow   time.Duration
	manyWindows  int
	lockDur      time.Duration
	handoffN     int
	handoffHold  time.Duration
	redisBin     string
	out          string
}

// manySpec is one many-elections or many-locks run: a kind and a number
// of elections (locks).
type manySpec struct {
	locks bool
	kind  string
	n     int
}

// Kinds of the many-elections and many-locks runs.
var (
	manyElectionKinds = []string{"memory", "redis", "cluster", "etcd", "election"}
	manyLockKinds     = []string{"memory", "redis", "cluster", "etcd", "mutex"}
)

// parseMany parses a -many or -many-locks list: comma-separated entries
// kinds:counts, where kinds and counts may each be several, separated by
// '/' (every kind at every count, kinds varying fastest).
func parseMany(list string, locks bool) ([]manySpec, error) {
	kinds := manyElectionKinds
	if locks {
		kinds = manyLockKinds
	}
	type kn struct {
		kind string
		n    int
	}
	var specs []manySpec
	seen := make(map[kn]bool)
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		k, n, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("bad entry %q (want kind:n, kind one of %s)", s, strings.Join(kinds, ", "))
		}
		var ns []int
		for _, x := range strings.Split(n, "/") {
			num, err := strconv.Atoi(x)
			if err != nil || num <= 0 {
				return nil, fmt.Errorf("bad count %q in %q", x, s)
			}
			ns = append(ns, num)
		}
		ks := strings.Split(k, "/")
		for _, x := range ks {
			if !slices.Contains(kinds, x) {
				return nil, fmt.Errorf("bad kind %q in %q (want one of %s)", x, s, strings.Join(kinds, ", "))
			}
		}
		for _, num := range ns {
			for _, x := range ks {
				if !seen[kn{x, num}] {
					seen[kn{x, num}] = true
					specs = append(specs, manySpec{locks, x, num})
				}
			}
		}
	}
	return specs, nil
}

var scenarios = []string{"handover", "crash", "idle", "lock", "handoff", "many"}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c config
	only := fs.String("only", strings.Join(scenarios, ","), "comma-separated scenarios to run: "+strings.Join(scenarios, ","))
	fs.IntVar(&c.rounds, "rounds", 3, "interleaved rounds of the latency and lock scenarios (each figure is the median over rounds)")
	fs.IntVar(&c.handoverN, "handover-samples", 15, "hand-overs per implementation per round")
	fs.IntVar(&c.crashN, "crash-samples", 5, "crash failovers per implementation per round")
	fs.DurationVar(&c.ttl, "ttl", 2*time.Second, "lease/session TTL of the hand-over and crash scenarios (whole seconds, for etcd)")
	fs.DurationVar(&c.idleSettle, "idle-settle", 12*time.Second, "wait before counting idle requests")
	fs.DurationVar(&c.idleWindow, "idle-window", time.Minute, "window over which idle requests are counted (scaled to a minute)")
	fs.StringVar(&c.idleCadence, "idle-cadence", "default", "Sovereign's renewal cadence in the idle scenario: default (RenewInterval TTL/2), "+
		"or election (the cadence of an etcd session's keep-alives at the row's TTL: TTL/3 rounded up to its 500 ms tick)")
	idleTTLs := fs.String("idle-ttl", "10s,2s", "comma-separated TTLs of the idle scenario, each used by every implementation "+
		"(Sovereign Options.TTL, etcd session TTL; whole seconds); 10s is Sovereign's default")
	many := fs.String("many", "memory/redis/cluster/etcd/election:1000/10000",
		"many-elections runs: comma-separated kinds:counts, each '/'-separated, kinds memory, redis, cluster (Redis Cluster), etcd (Sovereign) "+
			"or election (etcd concurrency.Election); e.g. redis/etcd:100/1000")
	manyLocks := fs.String("many-locks", "memory/redis/cluster/etcd/mutex:1000/10000",
		"many-locks runs (one Locker holding n locks), like -many; kinds memory, redis, cluster, etcd (Sovereign package lock) "+
			"or mutex (etcd concurrency.Mutex)")
	fs.DurationVar(&c.manyTTL, "many-ttl", 0, "TTL of the many-elections and many-locks runs (0: the default, 10s)")
	fs.DurationVar(&c.manyJitter, "many-jitter", 0, "Sovereign electors' StartupJitter in the many-elections runs (0: the default, 250ms)")
	fs.IntVar(&c.manyInflight, "many-inflight", 0, "an experiment: at most this many backend calls at once per many-run backend, the others waiting in the client (0: no limit)")
	fs.BoolVar(&c.manyDiag, "many-diag", false, "many runs: print a per-second timeline and counts of backend calls by method and outcome, "+
		"gRPC calls by code, and dump goroutines to -diag-dir")
	fs.StringVar(&c.diagDir, "diag-dir", os.TempDir(), "directory of the -many-diag goroutine dumps")
	fs.StringVar(&c.plots, "plots", "plots", "directory the SVG plots are written to (empty: none)")
	fs.DurationVar(&c.manyBound, "many-bound", time.Minute, "how long every election may take to get its leader before a many-elections run is reported failed")
	fs.DurationVar(&c.manySettle, "many-settle", 6*time.Second, "wait after every election has its leader")
	fs.DurationVar(&c.manyWindow, "many-window", 0, "length of one many-elections measurement window "+
		"(0: two renewal intervals of the many runs' TTL, 2 × TTL/2, so that every window holds as many renewal instants)")
	fs.IntVar(&c.manyWindows, "many-windows", 3, "many-elections windows (CPU figures are the median over windows)")
	fs.DurationVar(&c.lockDur, "lock-duration", 2*time.Second, "length of one lock run")
	fs.IntVar(&c.handoffN, "handoff-samples", 30, "lock hand-offs per implementation per round")
	fs.DurationVar(&c.handoffHold, "handoff-hold", 50*time.Millisecond, "how long a holder keeps the lock in the hand-off scenario (uniform in [0.8, 1.2] × this)")
	fs.StringVar(&c.redisBin, "redis-server", "/usr/bin/redis-server", "redis-server binary")
	fs.StringVar(&c.out, "o", "", "also write the report (machine, table, notes) to this file")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (this process: clients, embedded etcd) to this file")
	quick := fs.Bool("quick", false, "a short smoke run: 1 round, few samples, short windows, 1,000 elections")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if *quick {
		c.rounds, c.handoverN, c.crashN = 1, 5, 2
		c.idleSettle, c.idleWindow = 3*time.Second, 20*time.Second
		*many = "memory/redis/cluster/etcd/election:1000"
		*manyLocks = "memory/redis/cluster/etcd/mutex:1000"
		c.manySettle, c.manyWindow, c.manyWindows = 3*time.Second, 3*time.Second, 1
		c.lockDur = 500 * time.Millisecond
		c.handoffN = 10
	}
	for _, f := range strings.Split(*idleTTLs, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d < time.Second || d%time.Second != 0 {
			return c, fmt.Errorf("-idle-ttl %q: want whole seconds, at least 1s (etcd leases count in seconds)", f)
		}
		c.idleTTLs = append(c.idleTTLs, d)
	}
	c.only = make(map[string]bool)
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.Contains(scenarios, s) {
			return c, fmt.Errorf("unknown scenario %q (want some of %s)", s, strings.Join(scenarios, ","))
		}
		c.only[s] = true
	}
	el, err := parseMany(*many, false)
	if err != nil {
		return c, fmt.Errorf("-many: %w", err)
	}
	lk, err := parseMany(*manyLocks, true)
	if err != nil {
		return c, fmt.Errorf("-many-locks: %w", err)
	}
	c.many = append(el, lk...)
	switch {
	case c.rounds < 1 || c.handoverN < 1 || c.crashN < 1 || c.handoffN < 1 || c.manyWindows < 1:
		return c, fmt.Errorf("rounds, samples and windows must be positive")
	case c.ttl < time.Second || c.ttl%time.Second != 0:
		return c, fmt.Errorf("-ttl %v: want whole seconds, at least 1s (etcd leases count in seconds)", c.ttl)
	case c.manyTTL < 0 || c.manyTTL%time.Second != 0:
		return c, fmt.Errorf("-many-ttl %v: want whole seconds (etcd leases count in seconds)", c.manyTTL)
	case c.manyWindow < 0:
		return c, fmt.Errorf("-many-window %v: want a positive duration, or 0 for the default", c.manyWindow)
	}
	if c.manyWindow == 0 {
		// A window of a fixed length holds one or two renewal instants of
		// the default RenewInterval (TTL/2) depending on where it starts:
		// with 5 s windows and TTL 10 s, 100,000 Redis locks measured 8 %
		// of a core in one window and 16 % in the next. Two intervals hold
		// two instants, wherever they start.
		ttl := c.manyTTL
		if ttl == 0 {
			ttl = sovereign.DefaultTTL
		}
		c.manyWindow = 2 * (ttl / 2)
	}
	return c, nil
}

func main() {
	if childMain(os.Args[1:]) {
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if cfg.cpuProfile != "" {
		stop, err := startCPUProfile(cfg.cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		defer stop()
	}
	if err := run(cfg); err != nil {
		if cfg.cpuProfile != "" {
			pprof.StopCPUProfile()
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// startCPUProfile starts a CPU profile written to path; stop ends it.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// startMemProfile records every allocation from now on (MemProfileRate 1),
// writes the allocation profile so far to path+".base", and returns a
// function that writes it again to path.
func startMemProfile(path string) (stop func(), err error) {
	runtime.MemProfileRate = 1
	write := func(path string) error {
		runtime.GC() // the profile is as of the last completed GC
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := write(path + ".base"); err != nil {
		return nil, err
	}
	return func() {
		if err := write(path); err != nil {
			fmt.Fprintln(os.Stderr, "memory profile:", err)
		}
	}, nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(cfg config) error {
	began := time.Now()
	rs, err := testredis.Launch(cfg.redisBin, testredis.Config{})
	if err != nil {
		return err
	}
	defer rs.Close()
	es, err := startEtcd()
	if err != nil {
		return err
	}
	defer es.stop()
	e := &env{redis: rs, redisBin: cfg.redisBin, etcd: es, log: slog.New(slog.DiscardHandler)}
	defer e.closeCluster()
	if os.Getenv("BENCH_LOG") != "" { // the electors' own logs, for debugging
		e.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	machine := machineInfo(cfg.redisBin, es)
	progress("redis-server on %s, etcd on %s", rs.Addr(), es.endpoint())

	r := newResults()
	if cfg.only["handover"] || cfg.only["crash"] {
		if err := latencies(e, cfg, r); err != nil {
			return err
		}
	}
	if cfg.only["idle"] {
		for _, ttl := range cfg.idleTTLs {
			var renew time.Duration // Sovereign's default
			label := fmt.Sprintf("TTL %v", ttl)
			if cfg.idleCadence == "election" {
				renew = electionCadence(ttl)
				label = fmt.Sprintf("TTL %v, Sovereign RenewInterval %v", ttl, renew)
			}
			progress("idle requests at %s: settle %v, window %v", label, cfg.idleSettle, cfg.idleWindow)
			m, err := e.idle(ttl, renew, cfg.idleSettle, cfg.idleWindow)
			if err != nil {
				return err
			}
			for _, col := range []string{colSovRedis, colSovEtcd, colElection} {
				r.add(fmt.Sprintf("Idle leader: backend requests/min (%s)", label), col, "%.1f", m[col].leader)
				r.add(fmt.Sprintf("Idle follower: backend requests/min (%s)", label), col, "%.1f", m[col].follower)
			}
		}
	}
	if cfg.only["lock"] {
		if err := locks(e, cfg, r); err != nil {
			return err
		}
	}
	if cfg.only["handoff"] {
		if err := handoffs(e, cfg, r); err != nil {
			return err
		}
	}
	if cfg.only["many"] {
		if err := manyElections(e, cfg, r); err != nil {
			return err
		}
	}
	notes(cfg, r)
	if cfg.plots != "" {
		files, err := r.writePlots(cfg.plots)
		if err != nil {
			return err
		}
		if len(files) > 0 {
			progress("plots: %s", strings.Join(files, ", "))
		}
	}
	table := r.markdown()
	fmt.Println(table)
	progress("done in %v", time.Since(began).Round(time.Second))
	if cfg.out != "" {
		report := machine + "\n" + table
		if err := os.WriteFile(cfg.out, []byte(report), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// latencies runs the hand-over and crash scenarios, interleaved: each round
// runs every implementation once, in a rotating order.
func latencies(e *env, cfg config, r *results) error {
	type impl struct {
		col      string
		handover func() ([]time.Duration, error)
		crash    func() ([]crashSample, error)
	}
	impls := []impl{
		{colSovRedis, func() ([]time.Duration, error) { return e.sovHandover(kindRedis, cfg.handoverN, cfg.ttl) },
			func() ([]crashSample, error) { return e.sovCrash(kindRedis, cfg.crashN, cfg.ttl) }},
		{colSovCluster, func() ([]time.Duration, error) { return e.sovHandover(kindCluster, cfg.handoverN, cfg.ttl) },
			func() ([]crashSample, error) { return e.sovCrash(kindCluster, cfg.crashN, cfg.ttl) }},
		{colSovEtcd, func() ([]time.Duration, error) { return e.sovHandover(kindEtcd, cfg.handoverN, cfg.ttl) },
			func() ([]crashSample, error) { return e.sovCrash(kindEtcd, cfg.crashN, cfg.ttl) }},
		{colElection, func() ([]time.Duration, error) { return e.electionHandover(cfg.handoverN, cfg.ttl) },
			func() ([]crashSample, error) { return e.electionCrash(cfg.crashN, cfg.ttl) }},
	}
	add := func(what string, col string, ds []time.Duration) {
		xs := make([]float64, len(ds))
		for i, d := range ds {
			xs[i] = ms(d)
		}
		r.sample(what, col, xs...)
		r.add(what+" p50 (ms)", col, "%.1f", percentile(xs, 50))
		r.add(what+" p99 (ms)", col, "%.1f", percentile(xs, 99))
	}
	for round := range cfg.rounds {
		for i := range impls {
			im := impls[(i+round)%len(impls)]
			if cfg.only["handover"] {
				progress("round %d/%d: hand-over, %s (%d samples)", round+1, cfg.rounds, im.col, cfg.handoverN)
				ds, err := im.handover()
				if err != nil {
					return err
				}
				add("Graceful hand-over", im.col, ds)
			}
		}
		for i := range impls {
			im := impls[(i+round)%len(impls)]
			if cfg.only["crash"] {
				progress("round %d/%d: crash failover, %s (%d samples)", round+1, cfg.rounds, im.col, cfg.crashN)
				cs, err := im.crash()
				if err != nil {
					return err
				}
				ds := make([]time.Duration, len(cs))
				reqs := make([]float64, len(cs))
				for i, c := range cs {
					ds[i], reqs[i] = c.delay, float64(c.requests)
				}
				add(fmt.Sprintf("Crash failover − TTL (TTL %v)", cfg.ttl), im.col, ds)
				r.add("Crash failover: requests the new leader sent, crash → leading", im.col, "%.0f", median(reqs))
			}
		}
	}
	return nil
}

// manyColumn returns the table column of a many run.
func manyColumn(s manySpec) string {
	switch s.kind {
	case "memory":
		return colSovMemory
	case "cluster":
		return colSovCluster
	case "etcd":
		return colSovEtcd
	case "election":
		return colElection
	case "mutex":
		return colMutex
	}
	return colSovRedis
}

// manyElections runs the many-elections and many-locks scenarios, each in a
// child process, and records their rows and curves.
func manyElections(e *env, cfg config, r *results) error {
	for _, s := range cfg.many {
		unit, holder := "elections", "leader"
		if s.locks {
			unit, holder = "locks held", "holder"
		}
		progress("many %s: %s × %d", unit, s.kind, s.n)
		mc := manyConfig{Locks: s.locks, Kind: s.kind, N: s.n, Redis: e.redis.Addr(), Etcd: e.etcd.endpoint(), TTL: cfg.manyTTL, Jitter: cfg.manyJitter, Inflight: cfg.manyInflight,
			Bound: cfg.manyBound, Settle: cfg.manySettle, Window: cfg.manyWindow, Windows: cfg.manyWindows,
			Diag: cfg.manyDiag, DiagDir: cfg.diagDir}
		col := manyColumn(s)
		switch s.kind {
		case "redis":
			mc.ServerPIDs = []int{e.redis.PID()}
		case "cluster":
			c, err := e.redisCluster(cfg.redisBin)
			if err != nil {
				return err
			}
			mc.Cluster, mc.ServerPIDs = c.Addrs(), c.PIDs()
		case "etcd", "election", "mutex":
			mc.ServerPIDs = []int{os.Getpid()}
		}
		n := humanInt(s.n)
		ttl := mc.ttl()
		res, err := runMany(mc)
		if err != nil {
			// Report it in the table's notes and go on: 10,000 elections
			// may be more than a small machine's etcd can serve.
			progress("  failed: %v", err)
			r.note("%s × %s %s failed: %v", col, n, unit, err)
			r.add(fmt.Sprintf("%s %s: %% with a %s two TTLs (%v) after start", n, unit, holder, 2*ttl), col, "%.1f", 0)
			r.fail(col, s)
			continue
		}
		progress("  all had a %s after %v (%d of %d within two TTLs); client CPU %v, server CPU %v, %.0f req/s, %.0f B and %.2f goroutines each, at end %d, losses %d",
			holder, res.Startup.Round(time.Millisecond), res.WithinTwoTTLs, s.n, res.ClientCPU, res.ServerCPU, res.ReqPerSec,
			res.HeapPerElection, res.GoroutinesPerEl, res.LeadersAtEnd, res.LeadershipLosses)
		pct := func(xs []float64) float64 { return 100 * median(xs) }
		per := "election"
		if s.locks {
			per = "lock"
		}
		r.add(fmt.Sprintf("%s %s: %% with a %s two TTLs (%v) after start", n, unit, holder, 2*ttl), col, "%.1f", 100*float64(res.WithinTwoTTLs)/float64(s.n))
		r.add(fmt.Sprintf("%s %s: seconds until every one had a %s", n, unit, holder), col, "%.1f", res.Startup.Seconds())
		r.add(n+" "+unit+": client CPU, % of one core", col, "%.1f", pct(res.ClientCPU))
		r.add(n+" "+unit+": server CPU, % of one core", col, "%.1f", pct(res.ServerCPU))
		r.add(n+" "+unit+": heap per "+per+" (KiB)", col, "%.1f", res.HeapPerElection/1024)
		r.add(n+" "+unit+": goroutines per "+per, col, "%.2f", res.GoroutinesPerEl)
		r.add(n+" "+unit+": backend requests/s", col, "%.1f", res.ReqPerSec)
		if res.LeadersAtEnd != s.n || res.LeadershipLosses != 0 {
			r.note("%s × %s %s: %d of %d had a %s at the end; %d lost it while measured.",
				col, n, unit, res.LeadersAtEnd, s.n, holder, res.LeadershipLosses)
		}
		x := float64(s.n)
		chart := "elections"
		if s.locks {
			chart = "locks"
		}
		r.point(chart+"-client-cpu", col, x, 1e6*median(res.ClientCPU)/x)
		r.point(chart+"-server-cpu", col, x, 1e6*median(res.ServerCPU)/x)
		r.point(chart+"-requests", col, x, res.ReqPerSec/x)
		r.point(chart+"-heap", col, x, res.HeapPerElection/1024)
		r.point(chart+"-goroutines", col, x, res.GoroutinesPerEl)
	}
	return nil
}

// humanInt writes n with thousands separators.
func humanInt(n int) string {
	s := strconv.Itoa(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func notes(cfg config, r *results) {
	if cfg.only["handover"] || cfg.only["crash"] || cfg.only["lock"] || cfg.only["handoff"] {
		var per []string
		if cfg.only["handover"] {
			per = append(per, fmt.Sprintf("%d hand-overs", cfg.handoverN))
		}
		if cfg.only["crash"] {
			per = append(per, fmt.Sprintf("%d crashes", cfg.crashN))
		}
		if cfg.only["handoff"] {
			per = append(per, fmt.Sprintf("%d lock hand-offs", cfg.handoffN))
		}
		s := fmt.Sprintf("Each latency and lock figure is the median over %d interleaved rounds (implementations in rotating order, on the same servers).", cfg.rounds)
		if len(per) > 0 {
			s += fmt.Sprintf(" p50/p99 are per round over %s per implementation (nearest rank, so with few samples p99 is the round's maximum).",
				strings.Join(per, ", "))
		}
		r.note("%s", s)
	}
	if cfg.only["handover"] || cfg.only["crash"] {
		r.note("Hand-over and crash use TTL %v for everyone (Sovereign Options.TTL, etcd session TTL), Sovereign defaults otherwise "+
			"(no startup jitter). Hand-over: Resign called → the other candidate's LeadershipAcquired event / Campaign returns. "+
			"Crash: right after a successful renewal (Sovereign) or keep-alive response (etcd session) the leader stops talking to the "+
			"store without releasing (Sovereign: its backend fails every call; etcd: its client is closed without revoking); figure = "+
			"crash → the next leader's acquisition − TTL, i.e. the delay beyond the lease's expiry.", cfg.ttl)
	}
	if cfg.only["idle"] {
		r.note("Idle: two candidates of one election at the row's TTL for everyone (Sovereign Options.TTL, other options at their "+
			"defaults; etcd concurrency.Election's session TTL), counted over %v after %v "+
			"of settling, scaled to a minute. Redis: commands counted at the server with MONITOR (each EVALSHA is one; pub/sub PINGs count); "+
			"etcd: gRPC unary calls plus messages sent on streams.", cfg.idleWindow, cfg.idleSettle)
	}
	if cfg.only["many"] {
		ttl := cfg.manyTTL
		if ttl == 0 {
			ttl = sovereign.DefaultTTL
		}
		r.note("Many elections / locks held: one child process, one client (and one backend; for concurrency.Election and Mutex one "+
			"session) shared by every election or lock, TTL %v. Elections: one candidate each, default options otherwise (all started "+
			"at once, each with the default startup jitter). Locks: one Locker acquires n distinct keys (%d acquisitions at a time) and "+
			"holds them (a lock lost is not acquired again, so it counts as without a holder); concurrency.Mutex: n mutexes of one session, locked. A run fails when not every one has its leader (holder) "+
			"%v after start; \"two TTLs\" is the goal of issue #13. After every one has it and %v of settling, %d window(s) of %v. "+
			"CPU = CPU time / wall time (median over windows; server = redis-server, the sum of the 3 masters for Redis Cluster, the "+
			"bench's own process for the embedded etcd; none for memory); heap = live heap after GC minus the baseline, / n; "+
			"requests = client-side count (go-redis hook, not counting pub/sub PINGs; gRPC interceptors for etcd; backend calls for "+
			"memory) over all windows.", ttl, manyParallel, cfg.manyBound, cfg.manySettle, cfg.manyWindows, cfg.manyWindow)
	}
	if cfg.only["lock"] {
		r.note("Lock pairs: one client (one process) per implementation, TTL %v, runs of %v after a warm-up; each goroutine "+
			"acquires and releases in a loop without waiting (Sovereign: lock.Locker TryAcquire + Lock.Release, default options, one Locker; "+
			"etcd concurrency.Mutex TryLock + Unlock, one session per goroutine; redsync/v4 LockContext + UnlockContext with one go-redis "+
			"pool and WithTries(1); bsm/redislock Obtain + Release, no retry). On one shared key an attempt that finds the key held counts "+
			"as failed and is retried at once; pairs/s counts successful pairs. \"backend contract alone\": redisbackend/etcdbackend "+
			"Acquire + Release, the floor under package lock. Requests: Redis commands counted with a go-redis hook, etcd RPCs "+
			"(unary calls and stream messages) with gRPC interceptors. Ratio: Sovereign-Redis ÷ the better of redsync and redislock; "+
			"Sovereign-etcd ÷ concurrency.Mutex.", lockTTL, cfg.lockDur)
	}
	if cfg.only["handoff"] {
		r.note("Lock hand-off: %d processes (each its own client; Sovereign: its own backend and Locker) contend for one key with a "+
			"waiting acquire; a holder keeps the lock %v ± 20%% (uniform), releases, and queues again once another process holds it, "+
			"so %d processes wait at each release. Figure: release call → the next holder's acquire returning; the first %d hand-offs "+
			"are not recorded. Waiting: Sovereign Locker.Acquire (woken by the backend's watch), etcd concurrency.Mutex.Lock (watches "+
			"its predecessor's key), redsync/v4 LockContext with its defaults (32 tries, 50-250 ms apart, uniform; called again "+
			"when out of tries), bsm/redislock Obtain with LinearBackoff(%v) (its README's example). Requests: every process, "+
			"acquire and release included (Redis: not counting pub/sub SUBSCRIBE/UNSUBSCRIBE, which bypass go-redis hooks).",
			handoffProcs, cfg.handoffHold, handoffProcs-1, handoffProcs, redislockRetry)
	}
}

// sourceVersion names the commit of the library measured (the bench module
// builds the working tree through its replace directive), and the library
// files changed since, if any.
func sourceVersion() string {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", args...).Output()
		return strings.TrimSpace(string(out)), err
	}
	top, err := git("rev-parse", "--show-toplevel")
	if err != nil {
		return "? (not run from the repository)"
	}
	head, err := git("-C", top, "log", "-1", "--format=%h %cs")
	if err != nil {
		return "?"
	}
	// Not trimmed: each porcelain line begins with a two-letter status,
	// whose first letter may be a space.
	out, _ := exec.Command("git", "-C", top, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench").Output()
	dirty := strings.TrimRight(string(out), "\n")
	if dirty == "" {
		return "commit " + head
	}
	var files []string
	for _, l := range strings.Split(dirty, "\n") {
		if len(l) > 3 {
			files = append(files, l[3:])
		}
	}
	return "commit " + head + " plus uncommitted changes to " + strings.Join(files, ", ")
}

// machineInfo describes the machine and the servers.
func machineInfo(redisBin string, es *etcdServer) string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	rv := "?"
	if out, err := exec.Command(redisBin, "--version").Output(); err == nil {
		rv = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("- Machine: %d CPUs (nproc), %s, %s/%s\n- Go: %s\n- %s\n- etcd %s (embedded, go.etcd.io/etcd/server/v3/embed; one member, 10 ms heartbeat)\n- Redis Cluster (when used): 3 masters of the same redis-server, no replicas, on loopback\n- Sovereign: %s\n",
		runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version(), rv, es.version(), sourceVersion())
}
