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
	if err := run(t.Context(), &out, 100*time.Millisecond); err != nil {
		t.Fatalf("run: %v", err)
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []string{
		"worker-1 wrote task-1 = running (term ",
		"worker-2 wrote task-1 = done (term ",
		"task store rejected it: stale fencing term: worker-1 wrote \"done\" to task-1 with term ",
		"worker-1's lock: held false, lock \"tasks/task-1\" lost",
		"worker-1 releases: lock: release \"tasks/task-1\": lock \"tasks/task-1\" lost",
		"task-1  done     by worker-2 fencing_term ",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
