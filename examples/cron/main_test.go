package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	var out bytes.Buffer
	// The last replica's tick comes 0.4 of the period after the first,
	// after the job has finished, and the lock is kept 0.9 of it: 200 ms
	// to spare on a loaded machine.
	if err := run(t.Context(), &out, 2, 400*time.Millisecond); err != nil {
		t.Fatalf("run: %v", err)
	}
	s := out.String()
	t.Log("\n" + s)
	const key = "cron/nightly-report"
	for text, want := range map[string]int{"runs " + key + " (fencing term": 2, "finished " + key: 2, "skips " + key + ": held by replica-": 4} {
		if n := strings.Count(s, text); n != want {
			t.Errorf("%q: got %d lines, want %d (one run and two skips per tick, two ticks)", text, n, want)
		}
	}
	// Each tick's skips name that tick's runner.
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if i := strings.Index(line, " runs "); i >= 0 {
			runner := line[strings.Index(line, "] ")+2 : i]
			if n := strings.Count(s, "held by "+runner); n < 2 {
				t.Errorf("%s ran, but only %d skips name it, want 2 or more", runner, n)
			}
		}
	}
}
