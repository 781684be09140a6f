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
