package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// redisEnv starts a redis-server and returns the environment naming it as
// the backend, and a backend for the test's own reads.
func redisEnv(t *testing.T) (*testredis.Server, []string, backend.Backend) {
	t.Helper()
	srv := testredis.Start(t)
	b, err := redisbackend.New(srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true}), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return srv, []string{"SOVEREIGN_BACKEND=redis://" + srv.Addr()}, b
}

// getRecord reads key, failing the test on errors other than ErrNotHeld.
func getRecord(t *testing.T, b backend.Backend, key string) (backend.Record, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	rec, err := b.Get(ctx, key)
	if errors.Is(err, backend.ErrNotHeld) {
		return backend.Record{}, false
	}
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return rec, true
}

func TestRunExitStatus(t *testing.T) {
	_, env, b := redisEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"exit 0", []string{"--", "true"}, 0},
		{"exit 7", []string{"--", "sh", "-c", "exit 7"}, 7},
		{"killed by SIGKILL", []string{"--", "sh", "-c", "kill -9 $$"}, 128 + 9},
		{"shell", []string{"--shell", "--", "exit", "5"}, 5},
		{"without --", []string{"sh", "-c", "exit 9"}, 9},
		{"not found", []string{"--", "/nonexistent/command"}, exitNotFound},
		{"not executable", []string{"--", "/etc/hostname"}, exitCannotExec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--ttl", "2s", "job"}, tc.args...)
			code, _, stderr := run(t, env, args...)
			if code != tc.want {
				t.Fatalf("got exit %d, want %d; stderr:\n%s", code, tc.want, stderr)
			}
			// The lease is released once the command has exited.
			if rec, held := getRecord(t, b, "job"); held {
				t.Fatalf("got %q held by %q after sovereign exited, want it released", "job", rec.HolderID)
			}
		})
	}
}

func TestUsageAndUnreachable(t *testing.T) {
	_, env, _ := redisEnv(t)
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	dead := "SOVEREIGN_BACKEND=redis://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"no backend", []string{"SOVEREIGN_BACKEND="}, []string{"status", "x"}, exitUsage},
		{"bad scheme", []string{"SOVEREIGN_BACKEND=mysql://x"}, []string{"status", "x"}, exitUsage},
		{"unknown command", env, []string{"frobnicate"}, exitUsage},
		{"unknown flag", env, []string{"status", "--frob", "x"}, exitUsage},
		{"no name", env, []string{"status"}, exitUsage},
		{"run without command", env, []string{"run", "job"}, exitUsage},
		{"grace too long", env, []string{"run", "--ttl", "10s", "--grace", "3s", "job", "--", "true"}, exitUsage},
		{"renew deadline above ttl", env, []string{"run", "--ttl", "2s", "--renew-deadline", "3s", "job", "--", "true"}, exitUsage},
		{"break without term", env, []string{"break", "job"}, exitUsage},
		{"no password flag", env, []string{"--password", "x", "status", "x"}, exitUsage},
		{"status unreachable", []string{dead}, []string{"--dial-timeout", "1s", "status", "x"}, exitUnavailable},
		{"run unreachable", []string{dead}, []string{"--dial-timeout", "1s", "run", "job", "--", "true"}, exitUnavailable},
		{"status free", env, []string{"status", "--exit-status", "nobody"}, exitFree},
		{"status free without --exit-status", env, []string{"status", "nobody"}, exitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, tc.env, tc.args...)
			if code != tc.want {
				t.Fatalf("got exit %d, want %d; stderr:\n%s", code, tc.want, stderr)
			}
		})
	}
}

// TestRunEnvSignals checks the child's environment, that signals reach it,
// and that its own exit status after SIGTERM is sovereign's, with the lease
// released.
func TestRunEnvSignals(t *testing.T) {
	_, env, b := redisEnv(t)
	kids := newChildren(t)
	p := start(t, append(append(env, kids.env("hold")...), "SOVEREIGN_ELECTION=stale", "SOVEREIGN_TERM=1"),
		"run", "--ttl", "2s", "--id", "node-a", "--metadata", "role=test", "job", "--", os.Args[0])
	startLine := kids.expect(0, "start")
	kids.expect(0, "ready")
	rec, held := getRecord(t, b, "job")
	if !held {
		t.Fatal("got job free while its command runs, want it held")
	}
	want := "SOVEREIGN_ELECTION=job SOVEREIGN_HOLDER_ID=node-a SOVEREIGN_TERM=" + strconv.FormatUint(rec.Term, 10)
	if got := strings.TrimSpace(startLine.text[strings.Index(startLine.text, "SOVEREIGN_"):]); got != want {
		t.Errorf("got child environment %q, want %q (no SOVEREIGN_BACKEND, no token)", got, want)
	}
	if strings.Contains(startLine.text, rec.Token) {
		t.Errorf("the child's environment contains the lease token")
	}
	if rec.HolderID != "node-a" || rec.Metadata["role"] != "test" || rec.Metadata["cmd"] == "" {
		t.Errorf("got holder %q metadata %v, want node-a with role=test and cmd", rec.HolderID, rec.Metadata)
	}
	if pgid, pid := field(startLine.text, "pgid"), field(startLine.text, "pid"); pgid != pid {
		t.Errorf("got child pgid %s, want its own process group %s", pgid, pid)
	}
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGHUP, syscall.SIGUSR2, syscall.SIGINT} {
		p.signal(sig)
		kids.expect(0, "signal "+sig.String())
	}
	p.signal(syscall.SIGTERM)
	kids.expect(0, "signal terminated")
	if code := p.wait(); code != 42 {
		t.Fatalf("got exit %d, want the child's 42", code)
	}
	if _, held := getRecord(t, b, "job"); held {
		t.Fatal("got job held after sovereign exited, want it released")
	}
}

// TestRunSignalWhileCampaigning: SIGTERM before being elected ends
// sovereign with 128+15 and no command ever starts.
func TestRunSignalWhileCampaigning(t *testing.T) {
	_, env, b := redisEnv(t)
	ctx := context.Background()
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "other", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, env, "run", "--ttl", "2s", "job", "--", "sh", "-c", "echo started")
	p.waitLog("state changed") // campaigning
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 128+15 {
		t.Fatalf("got exit %d, want %d", code, 128+15)
	}
	if out := p.stdoutText(); out != "" {
		t.Fatalf("got output %q, want none: the command must not run", out)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("the other holder's lease: %v", err)
	}
}

// TestRunWait: --wait gives up with 75 when someone else holds it.
func TestRunWait(t *testing.T) {
	_, env, b := redisEnv(t)
	ctx := context.Background()
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "other", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, env, "run", "--ttl", "2s", "--wait", "300ms", "job", "--", "echo", "started")
	if code != exitHeld || out != "" {
		t.Fatalf("got exit %d output %q, want %d and no output; stderr:\n%s", code, out, exitHeld, stderr)
	}
}

// TestRunPartition cuts the leader's connection to Redis (black hole, via a
// TCP proxy) while its command ignores SIGTERM and has a grandchild. The
// leader must step down, SIGKILL its command's whole process group after
// the grace, exit 79, and the successor's command must start only after
// every process of the old one is gone.
func TestRunPartition(t *testing.T) {
	srv, env, _ := redisEnv(t)
	px := newProxy(t, srv.Addr())
	kids := newChildren(t)
	const ttl, renewDeadline, grace = 3 * time.Second, 2 * time.Second, 500 * time.Millisecond
	args := func(id string) []string {
		return []string{"run", "--ttl", ttl.String(), "--renew-deadline", renewDeadline.String(), "--grace", grace.String(),
			"--id", id, "job", "--", os.Args[0]}
	}
	a := start(t, append([]string{"SOVEREIGN_BACKEND=redis://" + px.Addr()}, kids.env("ignore-term")...), args("a")...)
	aStart := kids.expect(0, "start")
	gc := kids.expect(0, "grandchild")
	kids.expect(0, "ready")
	aPid, _ := strconv.Atoi(field(aStart.text, "pid"))
	gcPid, _ := strconv.Atoi(field(gc.text, "pid"))

	b := start(t, append(env, kids.env("hold")...), args("b")...)
	b.waitLog("state changed") // b campaigns

	px.Partition()
	stopping := logTime(t, a.waitLog("stopping the command"))
	killed := logTime(t, a.waitLog("SIGKILL"))
	if d := killed.Sub(stopping); d < grace {
		t.Fatalf("SIGKILL %v after SIGTERM, want the grace %v", d, grace)
	}
	// The first child's connection ends when it dies.
	var aDied time.Time
	gotTerm := false
	for aDied.IsZero() {
		l := kids.next("child 0 to die")
		switch {
		case l.conn == 0 && l.eof:
			aDied = l.at
		case l.conn == 0 && strings.HasPrefix(l.text, "signal terminated"):
			gotTerm = true // it got SIGTERM and ignored it
		default:
			t.Fatalf("got %+v before the first child died, want nothing from a successor", l)
		}
	}
	if !gotTerm {
		t.Fatal("the first child died without having received SIGTERM: want SIGTERM first, SIGKILL only after the grace")
	}
	bStart := kids.expect(1, "start")
	if !bStart.at.After(aDied) {
		t.Fatalf("successor's command started at %v, before the old one died at %v", bStart.at, aDied)
	}
	if alive(aPid) || alive(gcPid) {
		t.Fatalf("old command (pid %d alive %v) or its grandchild (pid %d alive %v) survives the successor's start",
			aPid, alive(aPid), gcPid, alive(gcPid))
	}
	if code := a.wait(); code != exitLost {
		t.Fatalf("got leader exit %d, want %d (lost)", code, exitLost)
	}
	t.Logf("SIGTERM→SIGKILL %v (grace %v); the old command's death seen %v after SIGKILL; the successor's command started %v after that",
		killed.Sub(stopping), grace, aDied.Sub(killed), bStart.at.Sub(aDied))
	b.signal(syscall.SIGTERM)
	if code := b.wait(); code != 42 {
		t.Fatalf("got successor exit %d, want its child's 42", code)
	}
}

// TestRunRejoin: with --rejoin, a lost term stops the command and the
// candidate campaigns again, starting the command afresh under a new term.
func TestRunRejoin(t *testing.T) {
	_, env, b := redisEnv(t)
	kids := newChildren(t)
	p := start(t, append(env, kids.env("hold")...), "run", "--ttl", "2s", "--rejoin", "--id", "a", "job", "--", os.Args[0])
	first := kids.expect(0, "start")
	kids.expect(0, "ready")
	rec, _ := getRecord(t, b, "job")
	// Another process breaks the term: the store no longer holds the lease.
	if code, _, stderr := run(t, env, "break", "job", "--term", strconv.FormatUint(rec.Term, 10)); code != 0 {
		t.Fatalf("break: exit %d: %s", code, stderr)
	}
	// The store no longer holds the lease: killed at once, no SIGTERM first.
	if l := kids.next("the first command to end"); l.conn != 0 || !l.eof {
		t.Fatalf("got %+v, want the first command killed at once", l)
	}
	second := kids.expect(1, "start")
	if field(first.text, "SOVEREIGN_TERM") == field(second.text, "SOVEREIGN_TERM") {
		t.Fatalf("the command restarted under the same term %s, want a new one", field(first.text, "SOVEREIGN_TERM"))
	}
	kids.expect(1, "ready")
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 42 {
		t.Fatalf("got exit %d, want the child's 42", code)
	}
}

// TestRunParentDeath: when sovereign is killed with SIGKILL, the kernel
// kills its command (Linux parent-death signal).
func TestRunParentDeath(t *testing.T) {
	_, env, _ := redisEnv(t)
	kids := newChildren(t)
	p := start(t, append(env, kids.env("hold")...), "run", "--ttl", "2s", "job", "--", os.Args[0])
	kids.expect(0, "start")
	kids.expect(0, "ready")
	p.signal(syscall.SIGKILL)
	if l := kids.next("the command to die with sovereign"); l.conn != 0 || !l.eof {
		t.Fatalf("got %+v, want the command's end", l)
	}
}

// TestRunReleasesAfterExit: after SIGTERM is forwarded, the lease stays
// held for as long as the command takes to exit, and is released only then.
func TestRunReleasesAfterExit(t *testing.T) {
	_, env, b := redisEnv(t)
	kids := newChildren(t)
	p := start(t, append(env, kids.env("until-told")...), "run", "--ttl", "2s", "job", "--", os.Args[0])
	kids.expect(0, "start")
	kids.expect(0, "ready")
	before, _ := getRecord(t, b, "job")
	p.signal(syscall.SIGTERM)
	kids.expect(0, "signal terminated")
	// The command is winding down: the lease is still the same one, and is
	// renewed meanwhile (check across more than one TTL).
	renewed := time.Now().Add(3 * time.Second)
	for time.Now().Before(renewed) {
		rec, held := getRecord(t, b, "job")
		if !held || rec.Term != before.Term {
			t.Fatalf("got job held=%v term %d while the command winds down, want term %d held", held, rec.Term, before.Term)
		}
		select {
		case <-p.done:
			t.Fatalf("sovereign exited (%d) before its command", p.code)
		case <-time.After(200 * time.Millisecond): // sampling the store while the command winds down
		}
	}
	kids.tell(0, "exit 3")
	if code := p.wait(); code != 3 {
		t.Fatalf("got exit %d, want the command's 3", code)
	}
	if _, held := getRecord(t, b, "job"); held {
		t.Fatal("got job held after sovereign exited, want it released")
	}
}

// TestRunKillsLeftovers: a command that exits by itself leaving a process of
// its group behind (a daemonised helper, say) does not keep running unlocked:
// sovereign kills what is left of the group before it releases the lease
// and exits with the command's status.
func TestRunKillsLeftovers(t *testing.T) {
	_, env, b := redisEnv(t)
	kids := newChildren(t)
	p := start(t, append(env, kids.env("spawn-exit")...), "run", "--ttl", "2s", "job", "--", os.Args[0])
	kids.expect(0, "start")
	gc := kids.expect(0, "grandchild")
	gcPid, _ := strconv.Atoi(field(gc.text, "pid"))
	t.Cleanup(func() { _ = syscall.Kill(gcPid, syscall.SIGKILL) }) // if the test fails
	if code := p.wait(); code != 5 {
		t.Fatalf("got exit %d, want the command's 5", code)
	}
	if alive(gcPid) {
		t.Fatalf("the command's grandchild (pid %d) outlives sovereign: want its process group killed before the release", gcPid)
	}
	if _, held := getRecord(t, b, "job"); held {
		t.Fatal("got job held after sovereign exited, want it released")
	}
}

// logTime returns the time of a sovereign log line (time=... in slog's
// text format).
func logTime(t *testing.T, line string) time.Time {
	t.Helper()
	v := field(line, "time")
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatalf("log line %q: %v", line, err)
	}
	return ts
}

// TestRedisURLKinds runs a command through a Redis Cluster URL and a unix
// socket URL, and reads the result back with status.
func TestRedisURLKinds(t *testing.T) {
	cluster := testredis.StartConfig(t, testredis.Config{Cluster: true})
	sock := filepath.Join(t.TempDir(), "redis.sock")
	unix := testredis.StartConfig(t, testredis.Config{Args: []string{"--unixsocket", sock, "--unixsocketperm", "700"}})
	if cluster.External() || unix.External() {
		t.Skip("REDIS_ADDR or REDIS_CLUSTER_ADDR is set: this test needs servers it starts itself")
	}
	for _, url := range []string{"redis+cluster://" + cluster.Addr(), "unix://" + sock} {
		t.Run(url, func(t *testing.T) {
			// The command does not inherit SOVEREIGN_BACKEND: it gets the URL
			// through another variable.
			env := []string{"SOVEREIGN_BACKEND=" + url, "TEST_URL=" + url}
			code, out, stderr := run(t, env, "run", "--ttl", "2s", "--id", "x", "job", "--",
				"sh", "-c", `"$0" --backend "$TEST_URL" status --exit-status "$SOVEREIGN_ELECTION" || exit 99; exit 4`, bin)
			if code != 4 {
				t.Fatalf("got exit %d, want 4; stderr:\n%s", code, stderr)
			}
			if !strings.Contains(out, "holder     x") {
				t.Fatalf("status from inside the command printed:\n%s\nwant holder x", out)
			}
		})
	}
}

// TestCheckGrace: --grace defaults to half of ttl - renew-deadline; a grace
// that would let the command outlive the lease is refused.
func TestCheckGrace(t *testing.T) {
	for _, tc := range []struct {
		grace, ttl, renewDeadline time.Duration
		want                      time.Duration // 0: refused
	}{
		{0, 10 * time.Second, 7 * time.Second, 1500 * time.Millisecond},
		{0, 2 * time.Second, time.Second, 500 * time.Millisecond},
		{time.Second, 10 * time.Second, 7 * time.Second, time.Second},
		{3 * time.Second, 10 * time.Second, 7 * time.Second, 0},
		{4 * time.Second, 10 * time.Second, 7 * time.Second, 0},
		{-time.Second, 10 * time.Second, 7 * time.Second, 0},
	} {
		got, err := checkGrace(tc.grace, tc.ttl, tc.renewDeadline)
		if tc.want == 0 {
			if err == nil {
				t.Errorf("checkGrace(%v, ttl %v, renew deadline %v): got %v, want refused", tc.grace, tc.ttl, tc.renewDeadline, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("checkGrace(%v, ttl %v, renew deadline %v): got %v, %v; want %v", tc.grace, tc.ttl, tc.renewDeadline, got, err, tc.want)
		}
	}
}
