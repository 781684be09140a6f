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
	if err := run(t.Context(), &out, 200*time.Millisecond); err != nil {
		t.Fatalf("run: %v", err)
	}
	s := out.String()
	t.Log("\n" + s)
	if n := strings.Count(s, "tallying election 42"); n != 1 {
		t.Errorf("tallies: got %d, want exactly 1", n)
	}
	if !strings.Contains(s, "tally of election 42 done") {
		t.Error("the tally did not finish")
	}
	if n := strings.Count(s, "already in progress, started by "); n != 1 {
		t.Errorf("refusals: got %d, want exactly 1", n)
	}
	if !strings.Contains(s, `held by "`) {
		t.Error("the HeldError's message is not shown")
	}
}
