package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
	"github.com/sovereign-go/sovereign/redisbackend"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// manyConfig configures one child process of the many-elections and
// many-locks scenarios.
type manyConfig struct {
	Locks      bool          // locks held by one Locker rather than elections
	Kind       string        // elections: memory, redis, cluster, etcd, election; locks: memory, redis, cluster, etcd, mutex
	N          int           // number of elections or locks
	Redis      string        // redis-server address
	Cluster    []string      // Redis Cluster node addresses
	Etcd       string        // etcd endpoint
	ServerPIDs []int         // the backend servers' processes, for their CPU time
	TTL        time.Duration // lease TTL; 0 for the default (10 s)
	Jitter     time.Duration // electors' StartupJitter; 0 for the default (250 ms)
	Inflight   int           // when positive, at most this many backend calls at once (an experiment)
	Bound      time.Duration // how long every election (lock) may take to get its leader (holder)
	Settle     time.Duration // wait after every election has a leader
	Window     time.Duration // length of one measurement window
	Windows    int           // number of windows
	Diag       bool          // print a timeline and counts of calls by outcome to stderr
	DiagDir    string        // with Diag: where to write goroutine dumps
}

// ttl returns the TTL in use.
func (c manyConfig) ttl() time.Duration {
	if c.TTL > 0 {
		return c.TTL
	}
	return sovereign.DefaultTTL
}

// what names the units measured, for messages.
func (c manyConfig) what() string {
	if c.Locks {
		return "locks"
	}
	return "elections"
}

// manyResult is what a child reports, as JSON on its standard output.
type manyResult struct {
	Startup          time.Duration // until every election had its leader (every lock its holder)
	WithinTwoTTLs    int           // elections with a leader (locks held) two TTLs after start
	ClientCPU        []float64     // per window: this process's CPU time / wall time
	ServerCPU        []float64     // per window: the servers' CPU time / wall time
	ReqPerSec        float64       // requests sent to the backend per second, over all windows
	HeapPerElection  float64       // bytes: live heap after GC, minus the baseline, / N
	GoroutinesPerEl  float64       // goroutines added per election (lock)
	Goroutines       int           // goroutines added in all
	LeadersAtEnd     int           // elections still led by their elector (locks still held) at the end
	LeadershipLosses int64         // elections whose leader was not leading throughout the measurement (locks lost)
}

// runMany runs the many-elections scenario in a child process, so that its
// CPU time and heap are its own (the embedded etcd server lives in the
// parent).
func runMany(cfg manyConfig) (manyResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return manyResult{}, err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return manyResult{}, err
	}
	cmd := exec.Command(exe, "-child-many", string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if os.Getenv("BENCH_LOG") != "" || cfg.Diag {
		cmd.Stderr = io.MultiWriter(os.Stderr, &errb)
	}
	if err := cmd.Run(); err != nil {
		msg := errb.String()
		if cfg.Diag { // already on stderr: keep the error short
			msg = lastLine(msg)
		}
		return manyResult{}, fmt.Errorf("many-%s child (%s, %d): %w: %s", cfg.what(), cfg.Kind, cfg.N, err, msg)
	}
	var r manyResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return manyResult{}, fmt.Errorf("many-%s child output %q: %w", cfg.what(), out.String(), err)
	}
	return r, nil
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// childMany is the body of the child process.
func childMany(arg string) error {
	var cfg manyConfig
	if err := json.Unmarshal([]byte(arg), &cfg); err != nil {
		return err
	}
	if p := os.Getenv("BENCH_CHILD_STARTUP_CPUPROFILE"); p != "" {
		// A CPU profile of the whole child (start-up included), for diagnosis.
		stop, err := startCPUProfile(p)
		if err != nil {
			return err
		}
		defer stop()
	}
	r, err := measureMany(cfg)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// manyUnits is what a child holds: elections or locks, of one kind.
type manyUnits struct {
	electors  []*sovereign.Elector
	elections []*concurrency.Election
	locks     []atomic.Pointer[lock.Lock] // set once acquired
	mutexes   []*concurrency.Mutex
	sess      *concurrency.Session
	held      atomic.Int64 // locks (or concurrency elections) held so far
}

// count returns how many elections lead (locks are held) now. A lock that
// was lost is not acquired again: it counts no more.
func (u *manyUnits) count() int {
	n := 0
	switch {
	case u.electors != nil:
		for _, e := range u.electors {
			if e != nil && e.IsLeader() {
				n++
			}
		}
	default:
		// Locks: counted up when acquired and down when their context
		// ends (lost), so a poll does not scan every lock (100,000
		// Held calls every 50 ms cost a fifth of a core, taken from the
		// run it measures).
		n = int(u.held.Load())
	}
	return n
}

func measureMany(cfg manyConfig) (manyResult, error) {
	var r manyResult
	ctx := context.Background()
	etcdCfg := clientv3.Config{Endpoints: []string{cfg.Etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}

	// One client and one backend (or session) for every election.
	var requests func() int64
	var b backend.Backend
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	var codes *grpcCodes
	u := &manyUnits{}
	switch cfg.Kind {
	case "memory":
		mb := memorybackend.New()
		closers = append(closers, func() { mb.Close() })
		b = mb
		// The memory backend has no wire: its calls are its requests,
		// counted by the backend itself (the methods that do no I/O
		// aside), so that it is measured unwrapped, with every capability
		// (backend.WatchNotifier included) an application gets.
		requests = func() int64 {
			var n int64
			for op, c := range mb.Calls() {
				switch op {
				case "ValidateKey", "MinTTL", "ModeSupport":
				default:
					n += c
				}
			}
			return n
		}
	case "redis", "cluster":
		ctr := &cmdCounter{}
		var cli redisbackend.Client
		if cfg.Kind == "redis" {
			c := newRedisClient(cfg.Redis, "many", ctr)
			closers = append(closers, func() { c.Close() })
			cli = c
		} else {
			c := newClusterClient(cfg.Cluster, "many", ctr)
			closers = append(closers, func() { c.Close() })
			cli = c
		}
		rb, err := redisbackend.New(cli, nil)
		if err != nil {
			return r, err
		}
		closers = append(closers, func() { rb.Close() })
		b, requests = rb, ctr.n.Load
	case "etcd", "election", "mutex":
		ctr := &rpcCounter{}
		ctr.configure(&etcdCfg)
		if cfg.Diag {
			codes = &grpcCodes{n: make(map[string]int64)}
			etcdCfg.DialOptions = append(etcdCfg.DialOptions, codes.interceptor())
		}
		cli, err := clientv3.New(etcdCfg)
		if err != nil {
			return r, err
		}
		closers = append(closers, func() { cli.Close() })
		requests = ctr.requests
		if cfg.Kind == "etcd" {
			eb, err := etcdbackend.New(cli, nil)
			if err != nil {
				return r, err
			}
			closers = append(closers, func() { eb.Close() })
			b = eb
		} else {
			u.sess, err = concurrency.NewSession(cli, concurrency.WithTTL(int(cfg.ttl().Round(time.Second)/time.Second)))
			if err != nil {
				return r, err
			}
			closers = append(closers, func() { u.sess.Close() })
		}
	default:
		return r, fmt.Errorf("unknown kind %q", cfg.Kind)
	}
	if b != nil && cfg.Inflight > 0 {
		b = compose(newLimiter(b, cfg.Inflight), b)
	}
	var cb *countingBackend
	if b != nil && cfg.Diag {
		cb = newCountingBackend(b, cfg.Diag)
		b = compose(cb, b)
	}

	base := heapAlloc()
	baseG := runtime.NumGoroutine()
	start := time.Now()
	prefix := fmt.Sprintf("bench-many-%d-", time.Now().UnixNano())
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("BENCH_LOG") != "" { // the electors' own logs, for debugging
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	// The diagnostic timeline: once a second, the leaders (holders) so far
	// and the calls made by method and outcome.
	stopDiag := func() {}
	if cfg.Diag {
		stop := make(chan struct{})
		done := make(chan struct{})
		var once sync.Once
		stopDiag = func() { once.Do(func() { close(stop); <-done }) }
		go func() {
			defer close(done)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			var prev snapshot
			if cb != nil {
				prev = cb.snapshot()
			}
			q0 := requests()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				line := fmt.Sprintf("diag: t=%4.0fs %s %d/%d, goroutines %d, requests %d/s",
					time.Since(start).Seconds(), map[bool]string{true: "held", false: "leading"}[cfg.Locks],
					u.count(), cfg.N, runtime.NumGoroutine(), requests()-q0)
				q0 = requests()
				if cb != nil {
					s := cb.snapshot()
					line += "; " + s.diff(prev)
					prev = s
				}
				fmt.Fprintln(os.Stderr, line)
			}
		}()
	}
	defer func() { stopDiag() }()
	diagEnd := func(failed bool) {
		if !cfg.Diag {
			return
		}
		stopDiag()
		if cb != nil {
			cb.summary(os.Stderr)
		}
		if codes != nil {
			codes.write(os.Stderr)
		}
		if cfg.DiagDir != "" {
			p := filepath.Join(cfg.DiagDir, fmt.Sprintf("goroutines-%s-%s-%d.txt", cfg.what(), cfg.Kind, cfg.N))
			if err := dumpGoroutines(p); err != nil {
				fmt.Fprintln(os.Stderr, "diag: goroutine dump:", err)
			} else {
				fmt.Fprintln(os.Stderr, "diag: goroutine dump in", p)
			}
		}
	}

	twoTTLs := start.Add(2 * cfg.ttl())
	r.WithinTwoTTLs = -1
	// wait polls until every unit leads (is held) or the bound passes.
	wait := func() error {
		deadline := start.Add(cfg.Bound)
		for {
			n := u.count()
			if r.WithinTwoTTLs < 0 && !time.Now().Before(twoTTLs) {
				r.WithinTwoTTLs = n
			}
			if n == cfg.N {
				return nil
			}
			if time.Now().After(deadline) {
				diagEnd(true)
				return fmt.Errorf("only %d of %d %s had a %s %v after start (%d after two TTLs)", n, cfg.N, cfg.what(),
					map[bool]string{true: "holder", false: "leader"}[cfg.Locks], cfg.Bound, r.WithinTwoTTLs)
			}
			time.Sleep(50 * time.Millisecond) // polling an observable condition
		}
	}

	switch {
	case !cfg.Locks && b != nil:
		u.electors = make([]*sovereign.Elector, cfg.N)
		closers = append(closers, func() {
			var wg sync.WaitGroup
			for _, e := range u.electors {
				if e != nil {
					wg.Go(func() { e.Close() })
				}
			}
			wg.Wait()
		})
		for i := range u.electors {
			e, err := sovereign.New(b, prefix+strconv.Itoa(i), "x", &sovereign.Options{TTL: cfg.TTL, StartupJitter: cfg.Jitter, Logger: log})
			if err != nil {
				return r, err
			}
			if err := e.Start(ctx); err != nil {
				return r, err
			}
			u.electors[i] = e
		}
	case !cfg.Locks: // concurrency.Election
		u.elections = make([]*concurrency.Election, cfg.N)
		for i := range u.elections {
			u.elections[i] = concurrency.NewElection(u.sess, prefix+strconv.Itoa(i))
		}
		go parallel(cfg.N, func(i int) bool {
			cctx, cancel := context.WithDeadline(ctx, start.Add(cfg.Bound))
			defer cancel()
			if u.elections[i].Campaign(cctx, "x") != nil {
				return false
			}
			u.held.Add(1)
			return true
		})
	case b != nil: // package lock
		lk, err := lock.New(b, "bench", &lock.Options{TTL: cfg.TTL, Logger: log})
		if err != nil {
			return r, err
		}
		closers = append(closers, func() { lk.Close() })
		u.locks = make([]atomic.Pointer[lock.Lock], cfg.N)
		go parallel(cfg.N, func(i int) bool {
			for time.Now().Before(start.Add(cfg.Bound)) {
				cctx, cancel := context.WithDeadline(ctx, start.Add(cfg.Bound))
				l, err := lk.Acquire(cctx, prefix+strconv.Itoa(i), nil)
				cancel()
				if err == nil {
					u.locks[i].Store(l)
					u.held.Add(1)
					context.AfterFunc(l.Context(), func() { u.held.Add(-1) })
					return true
				}
				time.Sleep(50 * time.Millisecond) // back off after a failed call
			}
			return false
		})
	default: // concurrency.Mutex
		u.mutexes = make([]*concurrency.Mutex, cfg.N)
		for i := range u.mutexes {
			u.mutexes[i] = concurrency.NewMutex(u.sess, prefix+strconv.Itoa(i))
		}
		go parallel(cfg.N, func(i int) bool {
			cctx, cancel := context.WithDeadline(ctx, start.Add(cfg.Bound))
			defer cancel()
			if u.mutexes[i].Lock(cctx) != nil {
				return false
			}
			u.held.Add(1)
			return true
		})
	}
	if err := wait(); err != nil {
		return r, err
	}
	r.Startup = time.Since(start)
	if r.WithinTwoTTLs < 0 { // all done before two TTLs
		r.WithinTwoTTLs = cfg.N
	}

	time.Sleep(cfg.Settle) // let start-up traffic pass
	if p := os.Getenv("BENCH_CHILD_CPUPROFILE"); p != "" {
		// A CPU profile of the measurement windows, for diagnosis.
		stop, err := startCPUProfile(p)
		if err != nil {
			return r, err
		}
		defer stop()
	}
	if p := os.Getenv("BENCH_CHILD_MEMPROFILE"); p != "" {
		// Every allocation of the measurement windows, for diagnosis: p.base
		// is taken at their start and p at their end, so that
		// `go tool pprof -sample_index=alloc_objects -diff_base p.base bin p`
		// shows only theirs (both are written at rate 1, so start-up's
		// samples cancel out).
		stop, err := startMemProfile(p)
		if err != nil {
			return r, err
		}
		defer stop()
	}
	// An elector that lost its leadership while measured and won it back has
	// a new term: compare terms rather than subscribe (a listener would add
	// a goroutine per election to the figures).
	terms := make([]uint64, len(u.electors))
	for i, e := range u.electors {
		terms[i] = e.Term()
	}
	serverCPU := func() time.Duration {
		var t time.Duration
		for _, pid := range cfg.ServerPIDs {
			t += procCPUTime(pid)
		}
		return t
	}
	q00, t00 := requests(), time.Now()
	for range cfg.Windows {
		c0, s0, t0 := cpuTime(), serverCPU(), time.Now()
		time.Sleep(cfg.Window)
		c1, s1, t1 := cpuTime(), serverCPU(), time.Now()
		wall := t1.Sub(t0)
		r.ClientCPU = append(r.ClientCPU, float64(c1-c0)/float64(wall))
		if len(cfg.ServerPIDs) > 0 {
			r.ServerCPU = append(r.ServerCPU, float64(s1-s0)/float64(wall))
		}
	}
	r.ReqPerSec = float64(requests()-q00) / time.Since(t00).Seconds()
	for i, e := range u.electors {
		switch t := e.Term(); {
		case t == 0:
		case t != terms[i]:
			r.LeadershipLosses++
			r.LeadersAtEnd++
		default:
			r.LeadersAtEnd++
		}
		if terms[i] == 0 {
			r.LeadershipLosses++
		}
	}
	for i := range u.locks {
		if l := u.locks[i].Load(); l != nil && l.Held() {
			r.LeadersAtEnd++
		} else {
			r.LeadershipLosses++
		}
	}
	if u.sess != nil {
		r.LeadersAtEnd = cfg.N
		select {
		case <-u.sess.Done():
			r.LeadersAtEnd = 0
		default:
		}
	}
	r.HeapPerElection = float64(int64(heapAlloc())-int64(base)) / float64(cfg.N)
	r.Goroutines = runtime.NumGoroutine() - baseG
	// A goroutine of the baseline (a connection's reader, a timer's
	// callback) may be gone at the end: fewer than the baseline reads as
	// none added, not as -0.00 per election. r.Goroutines keeps the raw
	// difference for the progress line.
	r.GoroutinesPerEl = float64(max(r.Goroutines, 0)) / float64(cfg.N)
	diagEnd(false)
	runtime.KeepAlive(u)
	return r, nil
}

// parallel calls f(i) for every i below n, at most manyParallel at a time,
// and returns once every call has.
func parallel(n int, f func(i int) bool) {
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range min(n, manyParallel) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}

// manyParallel is how many locks (or concurrency elections) a child
// acquires at once at start-up. Sovereign electors campaign on their own.
const manyParallel = 256

// childMain runs the child mode when the flag is present; it reports whether
// it did.
func childMain(args []string) bool {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	arg := fs.String("child-many", "", "")
	if err := fs.Parse(args); err != nil || *arg == "" {
		return false
	}
	if err := childMany(*arg); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	return true
}
