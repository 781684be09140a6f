package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/internal/chaos"
	"github.com/sovereign-go/sovereign/internal/testetcd"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

var (
	flagDuration = flag.Duration("chaos.duration", 15*time.Second,
		"how long to inject faults, per backend (env SOVEREIGN_CHAOS_DURATION overrides the default)")
	flagSeed         = flag.Uint64("chaos.seed", 0, "random seed (0: from the clock; the seed is printed)")
	flagCandidates   = flag.Int("chaos.candidates", 5, "number of candidate processes")
	flagLogs         = flag.String("chaos.logs", "", "keep the candidates' logs in this directory (default: a temporary directory, kept only on failure)")
	flagAnalyze      = flag.String("chaos.analyze", "", "directory of a kept run to analyse again (TestAnalyzeSaved)")
	flagLockDuration = flag.Duration("chaos.lock-duration", 0,
		"how long to inject random faults, per backend, in the lock mode, after its planned faults (0: only those)")
	flagTryGuard = flag.Bool("chaos.trylock-guard", true,
		"TestChaosRedisTryLockGuard: run the candidates with RestartGuard (false shows the overlaps inside data-loss windows that the guard prevents; they are then reported, not failed)")
	flagRenewInterval = flag.Duration("chaos.renew-interval", 400*time.Millisecond,
		"the candidates' RenewInterval (at TTL 2s and RenewDeadline 1.4s; 1s is the elector's default cadence, TTL/2)")
	flagSlack = flag.Duration("chaos.slack", 1500*time.Millisecond,
		"scheduling slack added to TTL + (TTL - RenewDeadline) for the longest time without a leader after a fault")
)

// Timing of the candidates: short, so that many faults fit in a run.
const (
	ttl            = 2 * time.Second
	renewDeadline  = 1400 * time.Millisecond
	requestTimeout = 400 * time.Millisecond
	// serverBound bounds the time from a restarted store answering again
	// to a leader holding a lease in it.
	serverBound = ttl + time.Second
	// leaderWait bounds every wait for a leader to appear; far longer than
	// any failover should take, so that only a stuck election trips it.
	leaderWait = 20 * time.Second
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(cleanupM{m}, testetcd.IgnoredGoroutines()...)
}

// cleanupM removes the candidate binary after the tests.
type cleanupM struct{ m *testing.M }

func (c cleanupM) Run() int {
	code := c.m.Run()
	if candidate.dir != "" {
		os.RemoveAll(candidate.dir)
	}
	return code
}

// candidate is the candidate binary, built once for all the tests of a run.
var candidate struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func duration() time.Duration {
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "chaos.duration" })
	if !explicit {
		if s := os.Getenv("SOVEREIGN_CHAOS_DURATION"); s != "" {
			if d, err := time.ParseDuration(s); err == nil {
				return d
			}
		}
	}
	return *flagDuration
}

// TestAnalyzeSaved analyses a run kept with -chaos.logs again, with the
// analysis of this source tree: go test ./internal/chaos -run AnalyzeSaved
// -chaos.analyze=DIR/redis -v.
func TestAnalyzeSaved(t *testing.T) {
	if *flagAnalyze == "" {
		t.Skip("no -chaos.analyze directory given")
	}
	run, err := chaos.LoadRun(*flagAnalyze)
	if err != nil {
		t.Fatal(err)
	}
	r := chaos.Analyze(run)
	t.Logf("summary of %s:\n%s", *flagAnalyze, r)
	if !r.OK() {
		t.Errorf("%d violations", len(r.Violations))
	}
}

// TestChaosRedis runs the checker against a real redis-server with an
// append-only file, fsync always, so that a plain restart or crash keeps
// leases and term counters. The -nopersist restarts and crashes delete the
// append-only file while the server is down, so it comes back empty, as a
// server run with --save "" --appendonly no does: every lease, term counter
// and heartbeat record is lost.
func TestChaosRedis(t *testing.T) {
	addr, kinds, restartLost := redisFaults(t)
	runChaos(t, "redis", addr, append(kinds, sameID), []planned{{kind: restartLost, short: true}, {kind: sameID}})
}

// TestChaosRedisLock runs the checker in the lock mode against a real
// redis-server: the candidates loop on lock.Locker.Do for one key, each
// holding the lock for 0.5 to 3 s, so the lock moves between them, while
// the holder is killed, paused beyond the TTL and cut off, and the server
// restarts without its data. Only those planned faults are injected unless
// -chaos.lock-duration asks for random ones after them.
func TestChaosRedisLock(t *testing.T) {
	addr, kinds, restartLost := redisFaults(t)
	runMode(t, "lock", "redis", addr, *flagLockDuration, kinds, []planned{
		{kind: kill}, {kind: stop, long: true}, {kind: cut, long: true}, {kind: restartLost, short: true},
	})
}

// TestChaosRedisTryLockGuard runs the checker in the trylock mode against a
// real redis-server with RestartGuard: the candidates loop on
// lock.Locker.TryDo, which neither waits nor waits out a possible data loss,
// so after a restart that lost the holder's lease nothing but the server's
// refusal keeps another candidate from taking the lock beside the holder.
// No overlap is allowed, not even inside the data-loss windows that other
// runs excuse. With -chaos.trylock-guard=false it runs without the guard,
// to show the overlaps the guard prevents (reported, not failed).
func TestChaosRedisTryLockGuard(t *testing.T) {
	addr, kinds, restartLost := redisFaults(t)
	r := runSpec(t, spec{mode: "trylock", backend: "redis", target: addr, dur: *flagLockDuration, kinds: kinds, guard: *flagTryGuard,
		first: []planned{{kind: restartLost, short: true}, {kind: kill}, {kind: restartLost}, {kind: stop, long: true}}})
	if r != nil && r.DataLossOverlaps > 0 && *flagTryGuard {
		t.Errorf("chaos redis-trylock with RestartGuard: %d overlaps inside data-loss windows (longest %v), want none",
			r.DataLossOverlaps, r.DataLossOverlapMax)
	}
	if r != nil && r.DataLossFaults == 0 {
		t.Errorf("chaos redis-trylock: no fault lost the store's data: the guard was not exercised")
	}
}

// TestChaosRedisSemaphore runs the checker in the semaphore mode against a
// real redis-server: the candidates loop on lock.Locker.Do with a Shared
// lock of 2 permits on one key, each holding a permit for 0.5 to 3 s, while
// a holder is killed, paused beyond the TTL and cut off, and the server
// restarts without its data. Never more than 2 holds may be live at once
// (outside data-loss windows), and the permit of a faulted holder must be
// taken again within the failover bound.
func TestChaosRedisSemaphore(t *testing.T) {
	addr, kinds, restartLost := redisFaults(t)
	runSpec(t, spec{mode: "semaphore", backend: "redis", target: addr, dur: *flagLockDuration, kinds: kinds,
		first: []planned{{kind: kill}, {kind: stop, long: true}, {kind: cut, long: true}, {kind: restartLost, short: true}},
		limit: semaphoreLimit})
}

// TestChaosEtcdSemaphore runs the checker in the semaphore mode against an
// embedded one-member etcd: a holder is killed and paused beyond the TTL.
func TestChaosEtcdSemaphore(t *testing.T) {
	runSpec(t, spec{mode: "semaphore", backend: "etcd", target: etcdTarget(t), dur: *flagLockDuration,
		kinds: []faultKind{kill, stop, cut, drop, latency}, first: []planned{{kind: kill}, {kind: stop, long: true}},
		limit: semaphoreLimit})
}

// TestChaosSemaphoreCatches proves that the semaphore mode's check catches
// a broken limit: the candidates take a Shared lock of 3 permits, and the
// run is checked against 2. It must report holds begun with 3 live at once.
func TestChaosSemaphoreCatches(t *testing.T) {
	r := runSpec(t, spec{mode: "semaphore", backend: "etcd", target: etcdTarget(t), kinds: []faultKind{kill},
		first: []planned{{kind: kill}}, limit: semaphoreLimit + 1, check: semaphoreLimit, wantViolations: true})
	if r == nil {
		return
	}
	if r.OK() || r.Overlaps == 0 || r.MaxHolders <= semaphoreLimit {
		t.Errorf("candidates with %d permits checked against %d: got %d violations, %d holds begun over the limit, at most %d holds at once; want violations, holds over the limit, %d at once",
			semaphoreLimit+1, semaphoreLimit, len(r.Violations), r.Overlaps, r.MaxHolders, semaphoreLimit+1)
	}
	for _, v := range r.Violations {
		if !strings.HasPrefix(v, "holders at once:") {
			t.Errorf("got violation %q, want only %q ones", v, "holders at once:")
		}
	}
}

// semaphoreLimit is the number of permits of the semaphore mode.
const semaphoreLimit = 2

func etcdTarget(t *testing.T) string {
	c := testetcd.Start(t)
	u, err := url.Parse(c.Endpoint(0))
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestChaosEtcdLock runs the checker in the lock mode against an embedded
// one-member etcd: the holder is killed and paused beyond the TTL.
func TestChaosEtcdLock(t *testing.T) {
	c := testetcd.Start(t)
	u, err := url.Parse(c.Endpoint(0))
	if err != nil {
		t.Fatal(err)
	}
	runMode(t, "lock", "etcd", u.Host, *flagLockDuration, []faultKind{kill, stop, cut, drop, latency},
		[]planned{{kind: kill}, {kind: stop, long: true}})
}

// redisFaults starts a redis-server with an append-only file and returns
// its address, the kinds of faults of a Redis run other than same-ID
// faults, and the short-lived restart without persistence.
func redisFaults(t *testing.T) (string, []faultKind, faultKind) {
	srv := testredis.StartConfig(t, testredis.Config{Persistent: true})
	admin := srv.NewClient(t, nil)
	dir := configGet(t, admin, "dir")
	aofDir := filepath.Join(dir, configGet(t, admin, "appenddirname"))
	// outage stops the server with halt, wipes its data when lose is set,
	// keeps it down for down and starts it again; a marker key written
	// before proves that the data survived, or did not.
	outage := func(halt func(t *testing.T), lose bool) serverFault {
		return func(t *testing.T, down time.Duration) (restarted, up int64) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := admin.Set(ctx, markerKey, "1", 0).Err(); err != nil {
				t.Errorf("set the marker key before an outage: %v", err)
			}
			halt(t)
			if lose {
				if err := os.RemoveAll(aofDir); err != nil {
					t.Errorf("wipe the append-only files: %v", err)
				}
			}
			pause(down)
			restarted = chaos.Now()
			srv.Start(t)
			up = chaos.Now()
			want := int64(1)
			if lose {
				want = 0
			}
			if n, err := admin.Exists(ctx, markerKey).Result(); err != nil || n != want {
				t.Errorf("after the outage (data lost: %v): got %d marker keys (err %v), want %d", lose, n, err, want)
			}
			return restarted, up
		}
	}
	restart := func(*testing.T) { srv.Stop() }
	crash := func(t *testing.T) { srv.Kill(t) }
	restartLost := faultKind{name: "redis-restart-nopersist", server: outage(restart, true), dataLoss: true, shortOdds: 2}
	return srv.Addr(), []faultKind{
		kill, stop, cut, drop, latency,
		// The server stays down for a while: mostly longer than the TTL,
		// so the leader steps down and its lease expires while nobody can
		// reach the store.
		{name: "redis-restart", server: outage(restart, false), shortOdds: 5},
		{name: "redis-crash", server: outage(crash, false), shortOdds: 5},
		// Half of these are short, so that the leader is still leading
		// when the store comes back empty: the data-loss window.
		restartLost,
		{name: "redis-crash-nopersist", server: outage(crash, true), dataLoss: true, shortOdds: 2},
	}, restartLost
}

// markerKey is written before every Redis outage, outside the election's
// keys, to check afterwards whether the server kept its data.
const markerKey = "chaos:marker"

func configGet(t *testing.T, c *redis.Client, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := c.ConfigGet(ctx, name).Result()
	if err != nil || m[name] == "" {
		t.Fatalf("CONFIG GET %s: got %v (err %v)", name, m, err)
	}
	return m[name]
}

// TestChaosEtcd runs the checker against an embedded one-member etcd.
func TestChaosEtcd(t *testing.T) {
	c := testetcd.Start(t)
	u, err := url.Parse(c.Endpoint(0))
	if err != nil {
		t.Fatal(err)
	}
	runChaos(t, "etcd", u.Host, []faultKind{kill, stop, cut, drop, latency, sameID}, []planned{{kind: sameID}, {kind: kill}})
}

// serverFault takes the server down for down and brings it back. It
// returns when the server process was started again and when it was seen
// answering: the store answered again at some moment between the two.
type serverFault func(t *testing.T, down time.Duration) (restarted, up int64)

// faultKind is a kind of fault: on the leader process, on its proxy, or on
// the server.
type faultKind struct {
	name     string
	proxy    chaos.Mode  // for proxy faults
	signal   bool        // SIGSTOP/SIGCONT
	server   serverFault // for server faults
	dataLoss bool        // the server comes back empty
	isKill   bool        // SIGKILL and a replacement
	sameID   bool        // processes with the leader's instance ID come and go
	// shortOdds: one in shortOdds of these faults lasts less than the
	// renew deadline, so the leader may survive it (0: none).
	shortOdds int
}

// planned is a fault injected before the random ones, so that even the
// short form exercises it: short forces a short one, long a long one
// (otherwise its duration is drawn as for a random fault).
type planned struct {
	kind        faultKind
	short, long bool
}

var (
	kill    = faultKind{name: "kill", isKill: true}
	stop    = faultKind{name: "stop", signal: true, shortOdds: 5}
	cut     = faultKind{name: "cut", proxy: chaos.Cut, shortOdds: 5}
	drop    = faultKind{name: "drop", proxy: chaos.Drop, shortOdds: 5}
	latency = faultKind{name: "latency", proxy: chaos.Latency, shortOdds: 5}
	sameID  = faultKind{name: chaos.KindSameID, sameID: true}
)

// proc is one candidate process.
type proc struct {
	id       string // unique name: log file, writes to the store
	instance string // instance ID it campaigns as
	slot     int
	cmd      *exec.Cmd
	logPath  string
	errPath  string
	done     chan struct{} // closed when the process has exited
	err      error         // exit error, set before done is closed

	killedAt int64
	stops    [][2]int64
}

// harness runs one chaos test.
type harness struct {
	t       *testing.T
	backend string
	mode    string // the candidates' -mode: elect, lock, trylock or semaphore
	limit   int    // the candidates' -limit (semaphore)
	check   int    // the permits the run is checked against (1 unless semaphore)
	guard   bool   // the candidates' -restart-guard
	wait    int    // the candidates' -wait-replicas
	bin     string
	logs    string
	store   *chaos.Store
	proxies []proxyGroup // one per slot; the last one is the twins' (same-ID faults)
	gens    []int
	rng     *rand.Rand
	twin    int // the slot of same-ID processes

	mu    sync.Mutex // guards procs, cur
	procs []*proc
	cur   map[int]*proc // running process of each slot
}

// runChaos runs the checker on one backend in the election mode: the
// candidates campaign with sovereign.Elector.
func runChaos(t *testing.T, backendName, target string, kinds []faultKind, first []planned) {
	runMode(t, "elect", backendName, target, duration(), kinds, first)
}

// runMode runs the checker on one backend with candidates in mode (elect
// or lock), injecting the faults first and then random ones of kinds until
// dur has passed.
func runMode(t *testing.T, mode, backendName, target string, dur time.Duration, kinds []faultKind, first []planned) {
	runSpec(t, spec{mode: mode, backend: backendName, target: target, dur: dur, kinds: kinds, first: first})
}

// spec is one run of the checker.
type spec struct {
	mode, backend, target string
	dur                   time.Duration
	kinds                 []faultKind
	first                 []planned
	// limit is the candidates' -limit in the semaphore mode, and check the
	// number of permits the run is checked against (default: limit).
	limit, check int
	// wantViolations expects the analysis to find violations: they are
	// then not errors, and the report is returned for the caller to check.
	wantViolations bool
	// guard runs the candidates with redisbackend's RestartGuard.
	guard bool
	// nodes are the addresses of a Redis Cluster's nodes (backend
	// "cluster", target unused): each candidate reaches each node through
	// a proxy of its own.
	nodes []string
	// waitReplicas is redisbackend's WaitReplicas of the candidates.
	waitReplicas int
	// inspect, when set, checks the run further (after the analysis).
	inspect func(t *testing.T, run chaos.Run)
}

// runSpec runs the checker as s says and returns its report (nil when the
// run did not get as far as the analysis).
func runSpec(t *testing.T, s spec) *chaos.Report {
	mode, backendName, target, dur, kinds, first := s.mode, s.backend, s.target, s.dur, s.kinds, s.first
	check := 1
	if mode == "semaphore" {
		check = s.limit
		if s.check > 0 {
			check = s.check
		}
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	name := backendName
	if mode != "elect" {
		name += "-" + mode
	}
	if backendName == "cluster" && s.waitReplicas == 0 {
		name += "-nowait"
	}
	t.Logf("chaos %s: seed %d (-chaos.seed=%d), %d candidates, faults for %v, TTL %v, renew deadline %v, renew interval %v, request timeout %v, data-loss window %v",
		name, seed, seed, *flagCandidates, dur, ttl, renewDeadline, renewInterval(), requestTimeout, dataLossWindow())

	if mode == "semaphore" {
		t.Logf("chaos %s: candidates with %d permits, checked against %d", name, s.limit, check)
	}
	h := &harness{t: t, backend: backendName, mode: mode, limit: s.limit, check: check, guard: s.guard, wait: s.waitReplicas,
		rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), cur: map[int]*proc{}}
	h.bin = buildCandidate(t)
	h.logs = logDir(t, name)

	store, err := chaos.NewSemaphoreStore(check)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	h.store = store
	n := *flagCandidates
	h.twin = n
	h.gens = make([]int, n+1)
	targets := []string{target}
	if s.nodes != nil {
		targets = s.nodes
	}
	for range n + 1 {
		g := proxyGroup{}
		for _, node := range targets {
			p, err := chaos.NewProxy(node)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			g.nodes = append(g.nodes, node)
			g.proxies = append(g.proxies, p)
		}
		g.cluster = s.nodes != nil
		h.proxies = append(h.proxies, g)
	}
	// However the test ends, no candidate outlives it.
	t.Cleanup(h.killAll)
	for slot := range n {
		h.start(slot, "")
	}
	if _, ok := h.waitLeader(0, 0); !ok {
		t.Fatalf("no leader within %v of starting %d candidates; logs in %s", leaderWait, n, h.logs)
	}

	var faults []chaos.Fault
	end := time.Now().Add(dur)
	for (time.Now().Before(end) || len(faults) < len(first)) && !t.Failed() {
		pause(300*time.Millisecond + rand.N(700*time.Millisecond))
		leader, ok := h.leaderNow()
		if !ok {
			if leader, ok = h.waitLeader(0, 0); !ok {
				t.Fatalf("no leader for %v; logs in %s", leaderWait, h.logs)
			}
		}
		k := kinds[h.rng.IntN(len(kinds))]
		d, short := h.faultDuration(k)
		if i := len(faults); i < len(first) {
			k = first[i].kind
			switch d, short = h.faultDuration(k); {
			case first[i].short:
				d, short = h.shortDuration(), true
			case first[i].long:
				d, short = h.longDuration(), false
			}
		}
		var above uint64
		if k.dataLoss {
			// The old leader may write on for a moment after the store
			// came back empty: wait for a new term (with a semaphore: for
			// holders of terms above every term written).
			if w, ok := h.store.Last(); ok {
				above = w.Term
			}
			for _, w := range h.store.Recent(time.Minute) {
				above = max(above, w.Term)
			}
		}
		f := h.inject(k, leader, d, short)
		faults = append(faults, f)
		if len(faults)%25 == 0 {
			t.Logf("chaos %s: %d faults injected, %v left", name, len(faults), time.Until(end).Round(time.Second))
		}
		since := f.Healed
		if f.DataLoss {
			// A leader of a lease the store lost may write on for the
			// data-loss window after the store came back: a leader seen
			// writing then may be that one, which leads no longer (and
			// the run could end before the real next leader began).
			since += int64(dataLossWindow())
		}
		if _, ok := h.waitLeader(since, above); !ok {
			t.Errorf("chaos %s: no leader within %v after %s of %s healed; logs in %s", name, leaderWait, f.Kind, f.Target, h.logs)
			break
		}
	}
	runEnd := chaos.Now()
	h.stopAll()

	sb := serverBound
	if s.guard {
		// The server refuses every free key until it has been up for the
		// TTL, counted in whole seconds: up to TTL + 1 s after it started
		// (which is before it answered), then the candidates' next attempt.
		sb += time.Second
	}
	run := chaos.Run{
		Faults: faults, Writes: store.Writes(), End: runEnd,
		Bound:          ttl + (ttl - renewDeadline) + *flagSlack,
		DataLossWindow: dataLossWindow(),
		ServerBound:    sb,
		Handover:       mode != "elect",
		Limit:          check,
	}
	h.mu.Lock()
	procs := h.procs
	h.mu.Unlock()
	for _, p := range procs {
		lines, err := chaos.ReadLines(p.logPath)
		if err != nil {
			t.Errorf("log of %s: %v", p.id, err)
		}
		run.Procs = append(run.Procs, chaos.Proc{ID: p.id, Lines: lines, KilledAt: p.killedAt, Stops: p.stops})
	}
	if err := chaos.SaveRun(filepath.Join(h.logs, "run.json"), run); err != nil {
		t.Errorf("save run: %v", err)
	}
	r := chaos.Analyze(run)
	if s.inspect != nil {
		s.inspect(t, run)
	}
	t.Logf("chaos %s summary (seed %d, %v of faults, %d processes):\n%s", name, seed, dur, len(procs), r)
	if !r.OK() && !s.wantViolations {
		t.Errorf("chaos %s: %d safety or liveness violations (see summary); logs in %s", name, len(r.Violations), h.logs)
	}
	if r.Terms < 2 && len(faults) > 0 {
		t.Errorf("chaos %s: got %d terms that led, want at least 2: no failover was exercised", name, r.Terms)
	}
	return r
}

// pause waits d: the duration of a fault or of a quiet period between two
// faults, not a synchronisation.
func pause(d time.Duration) { time.Sleep(d) }

// buildCandidate builds the candidate binary (once per test binary run)
// and returns its path.
func buildCandidate(t *testing.T) string {
	t.Helper()
	candidate.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			candidate.err = fmt.Errorf("the go command is needed to build the candidate: %w", err)
			return
		}
		if candidate.dir, err = os.MkdirTemp("", "sovereign-chaos-candidate-"); err != nil {
			candidate.err = err
			return
		}
		bin := filepath.Join(candidate.dir, "candidate")
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "./candidate")
		cmd := exec.Command(goBin, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			candidate.err = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out.String())
			return
		}
		candidate.bin = bin
		t.Logf("built the candidate (race %v) in %v", raceEnabled, time.Since(start).Round(time.Millisecond))
	})
	if candidate.err != nil {
		t.Fatal(candidate.err)
	}
	return candidate.bin
}

func logDir(t *testing.T, name string) string {
	if *flagLogs != "" {
		dir := filepath.Join(*flagLogs, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir, err := os.MkdirTemp("", "sovereign-chaos-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	return dir
}

// start starts a new generation of the candidate of slot, campaigning as
// instance (its own name when empty).
func (h *harness) start(slot int, instance string) *proc {
	h.gens[slot]++
	id := fmt.Sprintf("c%d.%d", slot+1, h.gens[slot])
	if slot == h.twin {
		id = fmt.Sprintf("twin.%d", h.gens[slot])
	}
	if instance == "" {
		instance = id
	}
	p := &proc{
		id:       id,
		instance: instance,
		slot:     slot,
		logPath:  filepath.Join(h.logs, id+".jsonl"),
		errPath:  filepath.Join(h.logs, id+".stderr"),
		done:     make(chan struct{}),
	}
	stderr, err := os.Create(p.errPath)
	if err != nil {
		h.t.Fatal(err)
	}
	p.cmd = exec.Command(h.bin,
		"-backend", h.backend,
		"-mode", h.mode,
		"-addr", h.proxies[slot].addr(),
		"-store", h.store.URL(),
		"-id", id,
		"-instance", instance,
		"-log", p.logPath,
		"-ttl", ttl.String(),
		"-renew-deadline", renewDeadline.String(),
		"-renew-interval", renewInterval().String(),
		"-request-timeout", requestTimeout.String(),
	)
	if h.mode == "semaphore" {
		p.cmd.Args = append(p.cmd.Args, "-limit", fmt.Sprint(h.limit))
	}
	if h.guard {
		p.cmd.Args = append(p.cmd.Args, "-restart-guard")
	}
	if h.wait > 0 {
		p.cmd.Args = append(p.cmd.Args, "-wait-replicas", fmt.Sprint(h.wait), "-wait-timeout", waitTimeout.String())
	}
	p.cmd.Stderr = stderr
	// Die with the test process, should it die without cleaning up.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		stderr.Close()
		h.t.Fatalf("start candidate %s: %v", id, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		stderr.Close()
		close(p.done)
	}()
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.cur[slot] = p
	h.mu.Unlock()
	return p
}

func (h *harness) byID(id string) *proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.cur {
		if p.id == id {
			return p
		}
	}
	return nil
}

// leaderNow returns the ID of the process whose write the store accepted in
// the last 250 ms: the process that acts as leader.
func (h *harness) leaderNow() (string, bool) {
	if h.check > 1 {
		// A semaphore: one of the holders writing now, at random.
		ids := h.holders(0, 0)
		if len(ids) == 0 {
			return "", false
		}
		return ids[h.rng.IntN(len(ids))], true
	}
	w, ok := h.store.Last()
	if !ok || chaos.Now()-w.At > int64(250*time.Millisecond) {
		return "", false
	}
	return w.ID, h.byID(w.ID) != nil
}

// waitLeader waits until a running process has had two writes of one term
// above above accepted after since, the last two accepted, and returns its
// ID. Two, because one can be the late write of a process that was paused
// between its check and its write and no longer leads.
//
// With a semaphore of h.check permits, it waits until h.check running
// processes hold a permit (holders) and returns one of them.
func (h *harness) waitLeader(since int64, above uint64) (string, bool) {
	deadline := time.Now().Add(leaderWait)
	for time.Now().Before(deadline) {
		if h.check > 1 {
			if ids := h.holders(since, above); len(ids) >= h.check {
				return ids[0], true
			}
			time.Sleep(10 * time.Millisecond) // polling the store for an observable condition
			continue
		}
		if ws := h.store.LastAccepted(2); len(ws) == 2 && ws[1].At > since && ws[0].ID == ws[1].ID && ws[0].Term == ws[1].Term &&
			ws[0].Term > above && chaos.Now()-ws[0].At < int64(250*time.Millisecond) && h.byID(ws[0].ID) != nil {
			return ws[0].ID, true
		}
		time.Sleep(10 * time.Millisecond) // polling the store for an observable condition
	}
	return "", false
}

// holders returns the running processes that hold a permit of the
// semaphore at once now, as the fenced store sees it: each has sent two
// writes of one term above above, after since, in the last 250 ms, accepted
// or not (the store for a semaphore may fence a holder that is still valid,
// an older permit's, once newer holders have written; and a paused process
// that no longer holds sends at most one late write), and the spans from the
// first to the last of those writes share a moment (holders that handed a
// permit over within the 250 ms are not taken for two at once). It returns
// the largest such set.
func (h *harness) holders(since int64, above uint64) []string {
	type span struct {
		id          string
		term        uint64
		n           int
		first, last int64
	}
	var spans []*span
	for _, w := range h.store.Recent(250 * time.Millisecond) {
		if w.At <= since || w.Term <= above {
			continue
		}
		i := slices.IndexFunc(spans, func(s *span) bool { return s.id == w.ID && s.term == w.Term })
		if i < 0 {
			spans = append(spans, &span{id: w.ID, term: w.Term, first: w.At})
			i = len(spans) - 1
		}
		spans[i].n++
		spans[i].last = w.At
	}
	var best []string
	for _, at := range spans {
		var ids []string
		for _, s := range spans {
			if s.n >= 2 && s.first <= at.first && at.first <= s.last && !slices.Contains(ids, s.id) && h.byID(s.id) != nil {
				ids = append(ids, s.id)
			}
		}
		if len(ids) > len(best) {
			best = ids
		}
	}
	return best
}

// waitStarted waits until p has logged its start line (it then handles
// SIGTERM) or exited, and reports whether it did within leaderWait.
func (h *harness) waitStarted(p *proc) bool {
	deadline := time.Now().Add(leaderWait)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return true
		default:
		}
		if lines, _ := chaos.ReadLines(p.logPath); len(lines) > 0 && lines[0].Ev == chaos.EvStart {
			return true
		}
		time.Sleep(10 * time.Millisecond) // polling the process's log for an observable condition
	}
	return false
}

// waitHeartbeat waits until p has logged a successful heartbeat (so it
// runs, handles SIGTERM, and has written the member record of its instance
// ID), and reports whether it did within leaderWait.
func (h *harness) waitHeartbeat(p *proc) bool {
	deadline := time.Now().Add(leaderWait)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return false
		default:
		}
		lines, _ := chaos.ReadLines(p.logPath)
		for _, l := range lines {
			if l.Ev == chaos.EvHeartbeat && l.Err == "" {
				return true
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the process's log for an observable condition
	}
	return false
}

// faultDuration returns how long a fault of kind k lasts: mostly longer
// than the TTL (the leader must lose), sometimes (one in k.shortOdds)
// shorter than the renew deadline (it may survive).
func (h *harness) faultDuration(k faultKind) (time.Duration, bool) {
	if k.shortOdds > 0 && h.rng.IntN(k.shortOdds) == 0 {
		return h.shortDuration(), true
	}
	return h.longDuration(), false
}

// longDuration returns a fault duration longer than the TTL: the leader (or
// the lock's holder) must lose.
func (h *harness) longDuration() time.Duration {
	return ttl + 300*time.Millisecond + time.Duration(h.rng.Int64N(int64(1200*time.Millisecond)))
}

func (h *harness) shortDuration() time.Duration {
	return 100*time.Millisecond + time.Duration(h.rng.Int64N(int64(600*time.Millisecond)))
}

// inject injects a fault of kind k lasting d on leader (or on the server)
// and returns when it has healed.
func (h *harness) inject(k faultKind, leader string, d time.Duration, short bool) chaos.Fault {
	t := h.t
	f := chaos.Fault{Kind: k.name, Target: leader}
	p := h.byID(leader)
	switch {
	case k.server != nil:
		f.Target, f.Short = "", short
		f.Server, f.DataLoss = true, k.dataLoss
		f.At = chaos.Now()
		f.Restarted, f.Healed = k.server(t, d)
	case k.sameID:
		// Processes campaigning with the leader's instance ID come and
		// go for d; each one removes the member record it shares with the
		// leader when it stops. Nobody may take the leader's live lease.
		f.At = chaos.Now()
		if p == nil {
			f.Healed = f.At
			break
		}
		end := time.Now().Add(d)
		for first := true; first || time.Now().Before(end); first = false {
			tw := h.start(h.twin, p.instance)
			if !h.waitHeartbeat(tw) {
				t.Errorf("same-ID process %s: no successful heartbeat within %v of its start; logs in %s", tw.id, leaderWait, h.logs)
			}
			pause(100*time.Millisecond + time.Duration(h.rng.Int64N(int64(400*time.Millisecond))))
			_ = tw.cmd.Process.Signal(syscall.SIGTERM)
			h.awaitExit(tw)
			h.mu.Lock()
			delete(h.cur, h.twin)
			h.mu.Unlock()
		}
		f.Healed = chaos.Now()
	case k.isKill:
		f.At = chaos.Now()
		f.Healed = f.At
		if p == nil {
			break
		}
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		p.killedAt = chaos.Now()
		f.Healed = p.killedAt
		h.start(p.slot, "")
	case k.signal:
		f.Short = short
		f.At = chaos.Now()
		if p == nil {
			f.Healed = f.At
			break
		}
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		pause(d)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		f.Healed = chaos.Now()
		p.stops = append(p.stops, [2]int64{f.At, f.Healed})
	default:
		f.Short = short
		var delay time.Duration
		if k.proxy == chaos.Latency {
			// Above the request timeout (the renew interval), so every
			// call through the proxy times out.
			delay = renewInterval() + 100*time.Millisecond + time.Duration(h.rng.Int64N(int64(500*time.Millisecond)))
		}
		slot := -1
		if p != nil {
			slot = p.slot
		}
		f.At = chaos.Now()
		if slot >= 0 {
			h.proxies[slot].set(k.proxy, delay)
			pause(d)
			h.proxies[slot].heal()
		}
		f.Healed = chaos.Now()
	}
	return f
}

// stopAll heals everything, then stops every candidate with SIGTERM and
// checks that each exits 0 in time.
func (h *harness) stopAll() {
	for _, g := range h.proxies {
		g.heal()
	}
	h.mu.Lock()
	var running []*proc
	for _, p := range h.cur {
		running = append(running, p)
	}
	h.mu.Unlock()
	for _, p := range running {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		// A process started a moment ago (the replacement of a killed
		// one, when the run ends at once) may not handle SIGTERM yet: its
		// start line comes after it does.
		if !h.waitStarted(p) {
			h.t.Errorf("candidate %s: no start line within %v of its start; logs in %s", p.id, leaderWait, h.logs)
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range running {
		h.awaitExit(p)
	}
	h.mu.Lock()
	clear(h.cur)
	h.mu.Unlock()
}

// awaitExit waits (at most 20 s) for p, sent SIGTERM, to exit, and checks
// that it exited 0.
func (h *harness) awaitExit(p *proc) {
	t := h.t
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("candidate %s did not exit within 20s of SIGTERM; logs in %s", p.id, h.logs)
		_ = p.cmd.Process.Kill()
		<-p.done
		return
	}
	if p.err != nil {
		msg, _ := os.ReadFile(p.errPath)
		code := -1
		var ee *exec.ExitError
		if errors.As(p.err, &ee) {
			code = ee.ExitCode()
		}
		t.Errorf("candidate %s: got exit %v (code %d), want exit 0 after SIGTERM; stderr:\n%s", p.id, p.err, code, tail(msg, 4000))
	}
}

// killAll kills whatever is still running (after a failed test).
func (h *harness) killAll() {
	h.mu.Lock()
	procs := h.procs
	h.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// proxyGroup is the fault proxies of one candidate slot: one in front of
// the server, or one in front of each node of a Redis Cluster. A fault
// switches them all.
type proxyGroup struct {
	nodes   []string // the address behind each proxy
	proxies []*chaos.Proxy
	cluster bool
}

// addr returns the candidate's -addr: the proxy's address, or for a
// Cluster node=proxy pairs.
func (g proxyGroup) addr() string {
	if !g.cluster {
		return g.proxies[0].Addr()
	}
	pairs := make([]string, len(g.proxies))
	for i, p := range g.proxies {
		pairs[i] = g.nodes[i] + "=" + p.Addr()
	}
	return strings.Join(pairs, ",")
}

func (g proxyGroup) set(m chaos.Mode, delay time.Duration) {
	for _, p := range g.proxies {
		p.Set(m, delay)
	}
}

func (g proxyGroup) heal() {
	for _, p := range g.proxies {
		p.Heal()
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}

// renewInterval is the candidates' RenewInterval (-chaos.renew-interval).
func renewInterval() time.Duration { return *flagRenewInterval }

// dataLossWindow is how long after a store that lost its data answers
// again a leader of a lease acquired before may still believe it leads:
// its first renewal after that is sent within a renew interval (sooner
// after a failed one) and fails (lease lost) within the request timeout;
// 250 ms of scheduling slack on a loaded machine. See README.md, "The
// data-loss window".
func dataLossWindow() time.Duration { return renewInterval() + requestTimeout + 250*time.Millisecond }
