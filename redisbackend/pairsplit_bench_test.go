package redisbackend

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// splitObtain is bsm/redislock v0.9.4's Obtain script; splitObtainSpin is
// its way to success on a free key (SET NX PX) after a busy wait of ARGV[4]
// µs by the server's clock: server time added to a redislock pair, and one
// more argument.
var (
	splitObtain = redis.NewScript(`
if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[3]) then return redis.status_reply("OK") end

local offset = tonumber(ARGV[2])
if redis.call("getrange", KEYS[1], 0, offset-1) == string.sub(ARGV[1], 1, offset) then return redis.call("set", KEYS[1], ARGV[1], "PX", ARGV[3]) end
`)
	splitObtainSpin = redis.NewScript(`
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) - start >= tonumber(ARGV[4])
if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[3]) then return redis.status_reply("OK") end
`)
)

// BenchmarkPairSplit splits the wall time of an acquisition and release of
// one free key from one goroutine (the bench's "1 goroutine" lock row) into
// this process's CPU and redis-server's CPU, on one real redis-server, in
// interleaved rounds of 4,000 pairs of each kind:
//
//	redislock        bsm/redislock's two scripts
//	redislock+Nµs    the same with N µs of busy server time added to the
//	                 acquisition (splitObtainSpin); the client does the
//	                 same
//	scripts          acquireScript and releaseScript run with Script.Run
//	                 and the Backend's arguments, without the Backend's code
//	backend          the Backend's Acquire and Release
//
// It reports the medians over rounds of each kind's wall µs, client CPU µs
// (this process: go-redis, the runtime and the kernel's work for it
// included) and server CPU µs per pair (/proc, 10 ms ticks). scripts
// against backend is what this package's client code costs; redislock
// against redislock+Nµs shows what server time alone does to the client's
// CPU and the wall time: a longer wait for each reply costs this process
// CPU too, with no change on its side (the runtime's idle path while the
// goroutine waits, presumably: spinning, then sleeping and being woken).
//
//	go test -run '^$' -bench BenchmarkPairSplit -benchtime 7x ./redisbackend
func BenchmarkPairSplit(b *testing.B) {
	const pairs = 4000 // per kind and round
	ctx := context.Background()
	srv := testredis.Start(b)
	if srv.External() {
		b.Skip("needs the server's PID for its CPU time")
	}
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true, DisableIdentity: true})
	be, err := New(c, &Options{Prefix: "split:"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	const holder = "bench"
	redislock := func(key string, spin int) func() error {
		return func() error {
			tok := backend.NewToken()[:22] // redislock's token: 16 random bytes, base64
			var err error
			if spin == 0 {
				err = splitObtain.Run(ctx, c, []string{key}, tok, 0, "10000").Err()
			} else {
				err = splitObtainSpin.Run(ctx, c, []string{key}, tok, 0, "10000", spin).Err()
			}
			if err != nil {
				return err
			}
			return pairFloorRelease.Run(ctx, c, []string{key}, tok).Err()
		}
	}
	lease := be.keyBase(backend.LockKeyPrefix + "scripts")
	kinds := []struct {
		name string
		pair func() error
	}{
		{"redislock", redislock("split:rl0", 0)},
		{"redislock+10µs", redislock("split:rl10", 10)},
		{"redislock+20µs", redislock("split:rl20", 20)},
		{"scripts", func() error {
			tok := backend.NewToken()
			if err := acquireScript.Run(ctx, c, []string{lease, lease + ":term"}, holder, tok, int64(10000), be.termKeepArg, be.publishArg, be.guardArg).Err(); err != nil {
				return err
			}
			return releaseScript.Run(ctx, c, []string{lease}, holder, tok, be.publishArg).Err()
		}},
		{"backend", func() error {
			l, err := be.Acquire(ctx, backend.AcquireRequest{Key: backend.LockKeyPrefix + "backend", HolderID: holder, TTL: 10 * time.Second})
			if err != nil {
				return err
			}
			return be.Release(ctx, l)
		}},
	}
	for _, k := range kinds { // load the scripts, warm the connection
		for range 100 {
			if err := k.pair(); err != nil {
				b.Fatalf("%s: %v", k.name, err)
			}
		}
	}
	type sample struct{ wall, client, server []float64 }
	got := make([]sample, len(kinds))
	round := 0
	for b.Loop() {
		for j := range kinds {
			i := (round + j) % len(kinds)
			start, c0, s0 := time.Now(), splitSelfCPU(), splitProcCPU(srv.PID())
			for range pairs {
				if err := kinds[i].pair(); err != nil {
					b.Fatalf("%s: %v", kinds[i].name, err)
				}
			}
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / pairs }
			got[i].wall = append(got[i].wall, per(time.Since(start)))
			got[i].client = append(got[i].client, per(splitSelfCPU()-c0))
			got[i].server = append(got[i].server, per(splitProcCPU(srv.PID())-s0))
		}
		round++
	}
	median := func(v []float64) float64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	for i, k := range kinds {
		b.ReportMetric(median(got[i].wall), k.name+"-wall-µs")
		b.ReportMetric(median(got[i].client), k.name+"-client-µs")
		b.ReportMetric(median(got[i].server), k.name+"-server-µs")
	}
}

// splitSelfCPU is the CPU time this process has used.
func splitSelfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// splitProcCPU is the CPU time process pid has used (user and system),
// from /proc in clock ticks of 10 ms; 0 when it cannot be read.
func splitProcCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	// The fields after the command name (in parentheses, which may hold
	// spaces): utime is field 14, stime 15.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100
}
