package redisbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// BenchmarkScale measures what many elections or many locks held by one
// process cost at rest on a real redis-server: client and server CPU,
// commands a minute, goroutines, heap. Run it once per size:
//
//	go test -run '^$' -bench BenchmarkScale -benchtime 1x ./redisbackend
//
// SOVEREIGN_SCALE_N sets the sizes (default "10000"), comma-separated.
func BenchmarkScale(b *testing.B) {
	sizes := []int{10000}
	if v := os.Getenv("SOVEREIGN_SCALE_N"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("SOVEREIGN_SCALE_N: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	for _, kind := range []string{"elections", "locks"} {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s=%d", kind, n), func(b *testing.B) {
				for range b.N {
					scaleRun(b, kind, n)
				}
			})
		}
	}
}

func scaleRun(b *testing.B, kind string, n int) {
	srv := testredis.Start(b)
	var cmds commandCounter
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 50})
	c.AddHook(&cmds)
	defer c.Close()
	info := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer info.Close()
	be, err := redisbackend.New(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	quiet := slog.New(slog.DiscardHandler)
	start := time.Now()
	var ready func() int
	switch kind {
	case "elections":
		es := make([]*sovereign.Elector, n)
		for i := range es {
			e, err := sovereign.New(be, fmt.Sprintf("scale-%d", i), "me", &sovereign.Options{TTL: 10 * time.Second, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			if err := e.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			es[i] = e
			defer e.Close()
		}
		ready = func() int {
			led := 0
			for _, e := range es {
				if e.IsLeader() {
					led++
				}
			}
			return led
		}
	case "locks":
		l, err := lock.New(be, "me", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		held := make([]*lock.Lock, 0, n)
		for i := range n {
			lk, err := l.TryAcquire(context.Background(), fmt.Sprintf("scale/%d", i), nil)
			if err != nil {
				b.Fatal(err)
			}
			held = append(held, lk)
		}
		ready = func() int {
			h := 0
			for _, lk := range held {
				if lk.Held() {
					h++
				}
			}
			return h
		}
	}
	for ready() < n {
		if time.Since(start) > 2*time.Minute {
			b.Fatalf("%d of %d %s ready after 2 minutes", ready(), n, kind)
		}
		time.Sleep(50 * time.Millisecond) // polling a measurement, not synchronising a test
	}
	readyAfter := time.Since(start)
	time.Sleep(3 * time.Second) // settle
	c0, s0, r0 := processCPU(), redisCPU(info), cmds.n.Load()
	const window = 10 * time.Second
	time.Sleep(window)
	c1, s1, r1 := processCPU(), redisCPU(info), cmds.n.Load()
	if got := ready(); got != n {
		b.Errorf("%d of %d %s still ready at the end", got, n, kind)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(100*float64(c1-c0)/float64(window), "client-%core")
	b.ReportMetric(100*float64(s1-s0)/float64(window), "server-%core")
	b.ReportMetric(float64(r1-r0)*float64(time.Minute)/float64(window), "commands/min")
	b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
	b.ReportMetric(float64(ms.HeapAlloc>>20), "heap-MiB")
	b.ReportMetric(readyAfter.Seconds(), "s-to-ready")
}

// commandCounter counts the commands a client sends, pipelined or not.
type commandCounter struct{ n atomic.Int64 }

func (*commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// processCPU is the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the CPU time the server has used, from INFO cpu.
func redisCPU(c *redis.Client) time.Duration {
	s, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(l, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}
