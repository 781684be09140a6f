package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
)

// A refusal of redisbackend's RestartGuard names no holder: the command
// says the lock may be held and for how long the store refuses it, not
// "held by """.
func TestDescribeHeldMayBeHeld(t *testing.T) {
	got := describeHeld(&lock.HeldError{Key: "db/backup", MayBeHeld: true,
		Holder: backend.Record{Key: "db/backup", TTL: 1520 * time.Millisecond}})
	for _, want := range []string{`lock "db/backup" may be held: the store restarted less than a TTL ago`, "refuses the lock for 1.5s more"} {
		if !strings.Contains(got, want) {
			t.Errorf("describeHeld: got %q, want it to contain %q", got, want)
		}
	}
	if strings.Contains(got, "held by") {
		t.Errorf("describeHeld: got %q, which names a holder", got)
	}
}

// --restart-guard: on a redis-server that has just started, `lock --try`
// is refused (exit 75, "may be held") and never runs its command; the
// flag is refused for a backend other than Redis.
func TestLockRestartGuard(t *testing.T) {
	_, env, _ := redisEnv(t)
	code, out, stderr := run(t, env, "lock", "--try", "--restart-guard", "--ttl", "10s", "db/backup", "--", "echo", "ran")
	if code != exitHeld || out != "" || !strings.Contains(stderr, `lock "db/backup" may be held: the store restarted`) {
		t.Fatalf("got exit %d output %q stderr %q, want %d, no output, and \"may be held\"", code, out, stderr, exitHeld)
	}
	code, _, stderr = run(t, []string{"SOVEREIGN_BACKEND=memory://"}, "lock", "--try", "--restart-guard", "k", "--", "true")
	if code != exitUsage || !strings.Contains(stderr, "--restart-guard is for Redis backends") {
		t.Fatalf("memory backend: got exit %d stderr %q, want %d and the flag refused", code, stderr, exitUsage)
	}
}
