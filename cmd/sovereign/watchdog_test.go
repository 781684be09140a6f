//go:build linux

package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startHolder starts sovereign with args and a helper command in mode
// "ignore-term" (it has a grandchild in its process group), waits until the
// command is ready and returns sovereign and the grandchild's pid.
func startHolder(t *testing.T, kids *children, env []string, conn int, args ...string) (*proc, int) {
	t.Helper()
	p := start(t, append(env, kids.env("ignore-term")...), append(args, "--", os.Args[0])...)
	kids.expect(conn, "start")
	gc := kids.expect(conn, "grandchild")
	gcPid, _ := strconv.Atoi(field(gc.text, "pid"))
	t.Cleanup(func() { _ = syscall.Kill(gcPid, syscall.SIGKILL) }) // if the test fails
	kids.expect(conn, "ready")
	return p, gcPid
}

// waitGone waits until process pid is gone (a zombie counts as gone).
func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs %v later", what, pid, wait)
		}
		time.Sleep(10 * time.Millisecond) // polling /proc: there is no event for another process's death
	}
}

// TestRunWatchdogWhileSovereignPaused: while sovereign alone is stopped,
// its command's watchdog kills the command's whole process group before the
// lease can expire (here 3.5 s after the last renewal, TTL 4 s): a
// successor started meanwhile starts its command only after that. When
// sovereign continues, it reports the lease lost (exit 79).
func TestRunWatchdogWhileSovereignPaused(t *testing.T) {
	_, env, _ := redisEnv(t)
	kids := newChildren(t)
	a, gcPid := startHolder(t, kids, env, 0, "run", "--ttl", "4s", "--renew-deadline", "2s", "job")
	a.signal(syscall.SIGSTOP)
	start(t, append(env, kids.env("hold")...), "run", "--ttl", "4s", "--renew-deadline", "2s", "job", "--", os.Args[0])
	if l := kids.next("the paused sovereign's command to end"); l.conn != 0 || !l.eof {
		t.Fatalf("got %+v, want the paused sovereign's command to end before its successor's starts", l)
	}
	kids.expect(1, "start")
	if alive(gcPid) {
		t.Fatalf("the paused sovereign's grandchild (pid %d) still runs after the successor's command started", gcPid)
	}
	a.signal(syscall.SIGCONT)
	if code := a.wait(); code != exitLost {
		t.Fatalf("got exit %d after SIGCONT, want %d (lost)", code, exitLost)
	}
	if !strings.Contains(a.stderrText(), "watchdog") {
		t.Errorf("the continued sovereign's log does not say its watchdog stopped the command:\n%s", a.stderrText())
	}
}

// TestLockWatchdogWhileSovereignPaused: the same for sovereign lock: the
// command and its group end while sovereign is stopped, and sovereign,
// continued, exits 79.
func TestLockWatchdogWhileSovereignPaused(t *testing.T) {
	_, env, _ := redisEnv(t)
	kids := newChildren(t)
	a, gcPid := startHolder(t, kids, env, 0, "lock", "--ttl", "2s", "db/migrate")
	a.signal(syscall.SIGSTOP)
	if l := kids.next("the paused sovereign's command to end"); l.conn != 0 || !l.eof {
		t.Fatalf("got %+v, want the paused sovereign's command to end", l)
	}
	waitGone(t, gcPid, "the paused sovereign's grandchild")
	a.signal(syscall.SIGCONT)
	if code := a.wait(); code != exitLost {
		t.Fatalf("got exit %d after SIGCONT, want %d (lost)", code, exitLost)
	}
}

// TestRunParentDeathKillsTheGroup: when sovereign is killed with SIGKILL,
// not only its command (the parent-death signal) but every process of the
// command's group ends: the watchdog sees the end of its pipe.
func TestRunParentDeathKillsTheGroup(t *testing.T) {
	_, env, _ := redisEnv(t)
	kids := newChildren(t)
	p, gcPid := startHolder(t, kids, env, 0, "run", "--ttl", "2s", "job")
	p.signal(syscall.SIGKILL)
	if l := kids.next("the command to die with sovereign"); l.conn != 0 || !l.eof {
		t.Fatalf("got %+v, want the command's end", l)
	}
	waitGone(t, gcPid, "the command's grandchild, after sovereign was killed,")
}
