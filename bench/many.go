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
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/redisbackend"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// manyConfig configures one child process of the many-elections scenario.
type manyConfig struct {
	Kind      string        // "redis", "etcd" or "election"
	N         int           // number of elections
	Redis     string        // redis-server address
	Etcd      string        // etcd endpoint
	ServerPID int           // the backend server's process, for its CPU time
	Bound     time.Duration // how long every election may take to get its leader
	Settle    time.Duration // wait after every election has a leader
	Window    time.Duration // length of one measurement window
	Windows   int           // number of windows
}

// manyResult is what a child reports, as JSON on its standard output.
type manyResult struct {
	Startup          time.Duration // until every election had its leader
	ClientCPU        []float64     // per window: this process's CPU time / wall time
	ServerCPU        []float64     // per window: the server's CPU time / wall time
	ReqPerSec        float64       // requests sent to the backend per second, over all windows
	HeapPerElection  float64       // bytes: live heap after GC, minus the baseline, / N
	GoroutinesPerEl  float64       // goroutines added per election
	LeadersAtEnd     int           // elections still led by their elector at the end
	LeadershipLosses int64         // elections whose leader was not leading throughout the measurement
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
	if os.Getenv("BENCH_LOG") != "" {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Run(); err != nil {
		return manyResult{}, fmt.Errorf("many-elections child (%s, %d): %w: %s", cfg.Kind, cfg.N, err, errb.String())
	}
	var r manyResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return manyResult{}, fmt.Errorf("many-elections child output %q: %w", out.String(), err)
	}
	return r, nil
}

// childMany is the body of the child process.
func childMany(arg string) error {
	var cfg manyConfig
	if err := json.Unmarshal([]byte(arg), &cfg); err != nil {
		return err
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
	var sess *concurrency.Session
	switch cfg.Kind {
	case "redis":
		ctr := &cmdCounter{}
		cli := newRedisClient(cfg.Redis, "many", ctr)
		closers = append(closers, func() { cli.Close() })
		rb, err := redisbackend.New(cli, nil)
		if err != nil {
			return r, err
		}
		closers = append(closers, func() { rb.Close() })
		b, requests = rb, ctr.n.Load
	case "etcd", "election":
		ctr := &rpcCounter{}
		ctr.configure(&etcdCfg)
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
			sess, err = concurrency.NewSession(cli)
			if err != nil {
				return r, err
			}
			closers = append(closers, func() { sess.Close() })
		}
	default:
		return r, fmt.Errorf("unknown kind %q", cfg.Kind)
	}

	base := heapAlloc()
	baseG := runtime.NumGoroutine()
	start := time.Now()
	prefix := fmt.Sprintf("bench-many-%d-", time.Now().UnixNano())
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("BENCH_LOG") != "" { // the electors' own logs, for debugging
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	var electors []*sovereign.Elector
	var elections []*concurrency.Election
	if b != nil {
		electors = make([]*sovereign.Elector, cfg.N)
		for i := range electors {
			e, err := sovereign.New(b, prefix+strconv.Itoa(i), "x", &sovereign.Options{Logger: log})
			if err != nil {
				return r, err
			}
			if err := e.Start(ctx); err != nil {
				return r, err
			}
			electors[i] = e
		}
		closers = append(closers, func() {
			var wg sync.WaitGroup
			for _, e := range electors {
				wg.Go(func() { e.Close() })
			}
			wg.Wait()
		})
		deadline := time.Now().Add(cfg.Bound)
		for {
			n := 0
			for _, e := range electors {
				if e.IsLeader() {
					n++
				}
			}
			if n == cfg.N {
				break
			}
			if time.Now().After(deadline) {
				return r, fmt.Errorf("only %d of %d elections had a leader %v after start", n, cfg.N, cfg.Bound)
			}
			time.Sleep(50 * time.Millisecond) // polling an observable condition
		}
	} else {
		elections = make([]*concurrency.Election, cfg.N)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		errs := make(chan error, cfg.N)
		for i := range elections {
			elections[i] = concurrency.NewElection(sess, prefix+strconv.Itoa(i))
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				cctx, cancel := context.WithTimeout(ctx, cfg.Bound)
				defer cancel()
				if err := elections[i].Campaign(cctx, "x"); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return r, fmt.Errorf("campaign: %w", err)
		}
	}
	r.Startup = time.Since(start)

	time.Sleep(cfg.Settle) // let start-up traffic pass
	// An elector that lost its leadership while measured and won it back has
	// a new term: compare terms rather than subscribe (a listener would add
	// a goroutine per election to the figures).
	terms := make([]uint64, len(electors))
	for i, e := range electors {
		terms[i] = e.Term()
	}
	q00, t00 := requests(), time.Now()
	for range cfg.Windows {
		c0, s0, t0 := cpuTime(), procCPUTime(cfg.ServerPID), time.Now()
		time.Sleep(cfg.Window)
		c1, s1, t1 := cpuTime(), procCPUTime(cfg.ServerPID), time.Now()
		wall := t1.Sub(t0)
		r.ClientCPU = append(r.ClientCPU, float64(c1-c0)/float64(wall))
		r.ServerCPU = append(r.ServerCPU, float64(s1-s0)/float64(wall))
	}
	r.ReqPerSec = float64(requests()-q00) / time.Since(t00).Seconds()
	for i, e := range electors {
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
	if elections != nil {
		r.LeadersAtEnd = cfg.N
		select {
		case <-sess.Done():
			r.LeadersAtEnd = 0
		default:
		}
	}
	r.HeapPerElection = float64(int64(heapAlloc())-int64(base)) / float64(cfg.N)
	r.GoroutinesPerEl = float64(runtime.NumGoroutine()-baseG) / float64(cfg.N)
	runtime.KeepAlive(elections)
	return r, nil
}

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
