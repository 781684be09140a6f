package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestLock runs a command under a lock on Redis, checks what a second
// `lock --try` says, `status`, `list`, then breaks the lock by its term: the
// holder must stop its command and exit 79.
func TestLock(t *testing.T) {
	_, env, b := redisEnv(t)
	kids := newChildren(t)
	holder := start(t, append(env, kids.env("ignore-term")...),
		"lock", "--ttl", "2s", "--id", "holder-a", "--metadata", "job=backup", "db/backup", "--", os.Args[0])
	startLine := kids.expect(0, "start")
	gc := kids.expect(0, "grandchild")
	gcPid, _ := strconv.Atoi(field(gc.text, "pid"))
	t.Cleanup(func() { _ = syscall.Kill(gcPid, syscall.SIGKILL) }) // if the test fails
	kids.expect(0, "ready")
	rec, held := getRecord(t, b, lockPrefix+"db/backup")
	if !held {
		t.Fatal("got db/backup free while its command runs")
	}
	term := strconv.FormatUint(rec.Term, 10)
	if got, want := startLine.text[strings.Index(startLine.text, "SOVEREIGN_"):], "SOVEREIGN_HOLDER_ID=holder-a SOVEREIGN_KEY=db/backup SOVEREIGN_TERM="+term; got != want {
		t.Errorf("got child environment %q, want %q", got, want)
	}

	t.Run("try", func(t *testing.T) {
		code, out, stderr := run(t, env, "lock", "--try", "db/backup", "--", "echo", "ran")
		if code != exitHeld || out != "" {
			t.Fatalf("got exit %d output %q, want %d and no output", code, out, exitHeld)
		}
		for _, want := range []string{`lock "db/backup" is held by "holder-a"`, "(term " + term + ")", "job=backup", "left"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("--try said %q, want it to contain %q", stderr, want)
			}
		}
	})
	t.Run("wait", func(t *testing.T) {
		code, out, stderr := run(t, env, "lock", "--wait", "300ms", "db/backup", "--", "echo", "ran")
		if code != exitHeld || out != "" || !strings.Contains(stderr, "gave up waiting") {
			t.Fatalf("got exit %d output %q stderr %q, want %d, no output, \"gave up waiting\"", code, out, stderr, exitHeld)
		}
	})
	t.Run("status", func(t *testing.T) {
		code, out, _ := run(t, env, "status", "--lock", "-o", "json", "--exit-status", "db/backup")
		var e entry
		if err := json.Unmarshal([]byte(out), &e); err != nil || code != 0 {
			t.Fatalf("got exit %d, %v: %s", code, err, out)
		}
		if e.Kind != "lock" || e.Name != "db/backup" || e.Holder != "holder-a" || e.Term != rec.Term || e.Metadata["job"] != "backup" || e.TTLSeconds <= 0 {
			t.Errorf("got %+v, want lock db/backup held by holder-a, term %d, job=backup, TTL left", e, rec.Term)
		}
		if len(e.Warnings) != 0 {
			t.Errorf("got warnings %q for a healthy lock, want none", e.Warnings)
		}
	})
	t.Run("status without --lock", func(t *testing.T) {
		code, out, stderr := run(t, env, "status", "--exit-status", "db/backup")
		if code != exitFree || !strings.Contains(out, "nobody holds it") {
			t.Fatalf("got exit %d output %q, want the election's: %d, nobody holds it", code, out, exitFree)
		}
		if want := `but a lock of that name is (holder "holder-a"): sovereign status --lock db/backup`; !strings.Contains(stderr, want) {
			t.Errorf("status of a lock key without --lock said %q, want the hint %q", stderr, want)
		}
	})
	t.Run("list", func(t *testing.T) {
		code, out, stderr := run(t, env, "list", "db/")
		if code != 0 {
			t.Fatalf("got exit %d: %s", code, stderr)
		}
		if !strings.Contains(out, "lock  db/backup  holder-a  "+term) {
			t.Errorf("list printed:\n%s\nwant a lock row for db/backup", out)
		}
	})
	t.Run("break", func(t *testing.T) {
		code, _, stderr := run(t, env, "break", "--lock", "db/backup", "--term", strconv.FormatUint(rec.Term+1, 10))
		if code != exitFree || !strings.Contains(stderr, "refusing") {
			t.Fatalf("break with the wrong term: got exit %d, %q; want %d and a refusal", code, stderr, exitFree)
		}
		if _, held := getRecord(t, b, lockPrefix+"db/backup"); !held {
			t.Fatal("break with the wrong term released the lock")
		}
		code, out, stderr := run(t, env, "break", "--lock", "db/backup", "--term", term)
		if code != 0 || !strings.Contains(stderr, "BREAKS MUTUAL EXCLUSION") || !strings.Contains(out, "released") {
			t.Fatalf("got exit %d, stdout %q, stderr %q; want 0, released, and the warning", code, out, stderr)
		}
	})
	// The holder learns at its next renewal that the lock is gone. The
	// store no longer holds it, so a successor may already run: the command
	// is killed at once, with no SIGTERM and no grace.
	holder.waitLog("lock lost; command stopped")
	if l := kids.next("the holder's command to die"); !l.eof {
		t.Fatalf("got child line %q, want the command killed at once (SIGKILL, no SIGTERM first)", l.text)
	}
	if code := holder.wait(); code != exitLost {
		t.Fatalf("got holder exit %d, want %d", code, exitLost)
	}
	if alive(gcPid) {
		t.Fatalf("the command's grandchild (pid %d) outlives the holder: want its whole process group killed", gcPid)
	}
	if code, out, _ := run(t, env, "lock", "--try", "db/backup", "--", "echo", "ran"); code != 0 || out != "ran\n" {
		t.Fatalf("got exit %d output %q after the break, want 0 and \"ran\"", code, out)
	}
}

// TestEtcd runs a candidate on an embedded etcd and follows it with
// watch, status and members; then breaks its term: watch reports the loss,
// the candidate stops its command and exits 79.
func TestEtcd(t *testing.T) {
	cluster := testetcd.Start(t)
	var hosts []string
	for _, e := range cluster.Endpoints() {
		hosts = append(hosts, strings.TrimPrefix(e, "http://"))
	}
	env := []string{"SOVEREIGN_BACKEND=etcd://" + strings.Join(hosts, ",")}
	b, err := etcdbackend.New(cluster.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	kids := newChildren(t)

	watch := start(t, env, "watch", "job")
	if l := watch.nextOut(); !strings.HasSuffix(l, " job no leader") {
		t.Fatalf("got watch line %q, want \"... job no leader\"", l)
	}
	cand := start(t, append(env, kids.env("hold")...), "run", "--ttl", "2s", "--id", "node-a", "job", "--", os.Args[0])
	kids.expect(0, "start")
	rec, held := getRecord(t, b, "job")
	if !held {
		t.Fatal("got job free while its command runs")
	}
	term := strconv.FormatUint(rec.Term, 10)
	if l := watch.nextOut(); !strings.HasSuffix(l, " job leader node-a term "+term) {
		t.Fatalf("got watch line %q, want \"... job leader node-a term %s\"", l, term)
	}

	code, out, stderr := run(t, env, "status", "job")
	if code != 0 || !strings.Contains(out, "holder     node-a") || !strings.Contains(out, "term       "+term) || !strings.Contains(out, "node-a (heartbeat") {
		t.Fatalf("status: exit %d\n%s\n%s", code, out, stderr)
	}
	// The README: holder, since, term, TTL left, heartbeat, metadata, members.
	for _, want := range []string{"\nsince      ", " ago)\n", "\nttl        ", " left\n", "\nheartbeat  ", "\nmetadata   cmd=", "\nmembers    node-a"} {
		if !strings.Contains(out, want) {
			t.Errorf("status: got\n%s\nwant it to contain %q", out, want)
		}
	}
	code, out, _ = run(t, env, "members", "job")
	if code != 0 || !strings.Contains(out, "node-a") || !strings.Contains(out, "holder") {
		t.Fatalf("members: exit %d\n%s", code, out)
	}
	code, out, stderr = run(t, env, "list")
	if code != 0 || !strings.Contains(out, "election  job   node-a  "+term) {
		t.Fatalf("list: exit %d\n%s\n%s", code, out, stderr)
	}

	if code, _, stderr := run(t, env, "break", "job", "--term", term); code != 0 {
		t.Fatalf("break: exit %d: %s", code, stderr)
	}
	if l := watch.nextOut(); !strings.HasSuffix(l, " job no leader") {
		t.Fatalf("got watch line %q after the break, want \"... job no leader\"", l)
	}
	cand.waitLog("leadership lost; command stopped")
	if code := cand.wait(); code != exitLost {
		t.Fatalf("got candidate exit %d, want %d", code, exitLost)
	}
	watch.signal(syscall.SIGINT)
	if code := watch.wait(); code != 0 {
		t.Fatalf("got watch exit %d after SIGINT, want 0", code)
	}
}

// TestListPrefixes runs list in-process on a memory store: elections and
// locks under a prefix, each shown once.
func TestListPrefixes(t *testing.T) {
	store := memorybackend.NewStore()
	b := store.Client()
	defer b.Close()
	for _, k := range []string{"app/a", "app/b", "other", lockPrefix + "app/l", lockPrefix + "zzz"} {
		if _, err := b.Acquire(context.Background(), backend.AcquireRequest{Key: k, HolderID: "h", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"app/a", "app/b", "lock/app/l", "lock/zzz", "other"}},
		{"app/", []string{"app/a", "app/b", "lock/app/l"}},
		{"lock/", []string{"lock/app/l", "lock/zzz"}},
		{"lo", []string{"lock/app/l", "lock/zzz"}},
		{"nothing", nil},
	} {
		var out, errb bytes.Buffer
		e := &env{stdout: &out, stderr: &errb, openHook: func() (*opened, error) {
			return &opened{Backend: b, close: func() {}, redacted: "memory://"}, nil
		}}
		if code := mainArgs(context.Background(), e, []string{"list", "-o", "json", tc.prefix}); code != 0 {
			t.Fatalf("list %q: exit %d: %s", tc.prefix, code, errb.String())
		}
		var entries []entry
		if err := json.Unmarshal(out.Bytes(), &entries); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, en := range entries {
			got = append(got, en.Key)
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("list %q: got %q, want %q", tc.prefix, got, tc.want)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://user:secret@host:6379/0":                   "redis://user:xxxxx@host:6379/0",
		"redis://:secret@host:6379":                         "redis://:xxxxx@host:6379",
		"etcd://root:pw@h1:2379,h2:2379":                    "etcd://root:xxxxx@h1:2379,h2:2379",
		"redis+sentinel://h:26379?master_name=m&password=x": "redis+sentinel://h:26379",
		"memory://": "memory://",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q): got %q, want %q", in, got, want)
		}
	}
}

// TestWatchJSON runs watch -o json in-process on a memory store: one line
// per change, "no leader" included, pushed by the store's watch.
func TestWatchJSON(t *testing.T) {
	store := memorybackend.NewStore()
	b := store.Client()
	defer b.Close()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{stdout: pw, stderr: io.Discard, openHook: func() (*opened, error) {
		return &opened{Backend: b, close: func() {}, redacted: "memory://"}, nil
	}}
	done := make(chan int, 1)
	go func() {
		// A long interval: changes must arrive through the watch, not a poll.
		done <- mainArgs(ctx, e, []string{"watch", "-o", "json", "--interval", "1h", "job"})
		pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	next := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("watch ended: %v", lines.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("%q: %v", lines.Text(), err)
		}
		return m
	}
	if m := next(); m["held"] != false || m["name"] != "job" {
		t.Fatalf("got %v, want job not held", m)
	}
	l := acquire(t, b, "job", "a", time.Hour, nil)
	if m := next(); m["held"] != true || m["holder"] != "a" || m["term"] != float64(l.Term) {
		t.Fatalf("got %v, want job held by a, term %d", m, l.Term)
	}
	if err := b.Release(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	if m := next(); m["held"] != false {
		t.Fatalf("got %v, want no leader", m)
	}
	cancel()
	go io.Copy(io.Discard, pr)
	if code := <-done; code != 0 {
		t.Fatalf("got watch exit %d, want 0", code)
	}
}

// TestLockExitStatus: lock exits with its command's status, or 127/126 when
// the command cannot start, and in every case gives the lock up before it
// exits (a command that never started must not leave the lock held for a
// TTL).
func TestLockExitStatus(t *testing.T) {
	_, env, b := redisEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"exit 0", []string{"--", "true"}, 0},
		{"exit 7", []string{"--", "sh", "-c", "exit 7"}, 7},
		{"not found", []string{"--", "/nonexistent/command"}, exitNotFound},
		{"not executable", []string{"--", "/etc/hostname"}, exitCannotExec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"lock", "--ttl", "1m", "job"}, tc.args...)
			code, _, stderr := run(t, env, args...)
			if code != tc.want {
				t.Fatalf("got exit %d, want %d; stderr:\n%s", code, tc.want, stderr)
			}
			if rec, held := getRecord(t, b, lockPrefix+"job"); held {
				t.Fatalf("got lock job held by %q after sovereign exited, want it released", rec.HolderID)
			}
		})
	}
}

// TestLockMinHold: with --min-hold, sovereign lock keeps the lock after its
// command exited until that long after taking it, then releases it and
// exits with the command's status: a cron replica whose tick comes after
// the job finished finds it held.
func TestLockMinHold(t *testing.T) {
	_, env, b := redisEnv(t)
	p := start(t, env, "lock", "--try", "--ttl", "1s", "--min-hold", "4s", "cron/report", "--", "true")
	p.waitLog("keeping the lock for --min-hold")
	code, out, stderr := run(t, env, "lock", "--try", "cron/report", "--", "echo", "ran")
	if code != exitHeld || out != "" {
		t.Fatalf("a late replica's lock --try: exit %d output %q (%s), want %d and no run while --min-hold lasts", code, out, stderr, exitHeld)
	}
	if code := p.wait(); code != 0 {
		t.Fatalf("got exit %d, want the command's 0", code)
	}
	if _, held := getRecord(t, b, lockPrefix+"cron/report"); held {
		t.Fatal("cron/report held after sovereign exited, want it released")
	}
}
