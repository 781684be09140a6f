package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun checks what the locks guarantee, not the timing: the migration
// runs alone and is not starved, the semaphore never exceeds 3, the
// hierarchy's conflicts are reported both ways.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), &out, 50*time.Millisecond); err != nil {
		t.Fatalf("run: %v", err)
	}
	s := out.String()
	t.Log("\n" + s)
	i, j := strings.Index(s, "migrator migrates"), strings.Index(s, "migration done")
	if i < 0 || j < i {
		t.Fatal("the migration did not run")
	}
	if strings.Contains(s[i:j], "reads the schema") {
		t.Error("a reader read while the migrator held the lock")
	}
	if !strings.Contains(s[j:], "reads the schema") {
		t.Error("no reader read after the migration")
	}
	if !strings.Contains(s, `late-reader refused: lock "schema/orders" held by "migrator"`) {
		t.Error("a late reader was not refused during the migration")
	}
	if n := strings.Count(s, " extracts ("); n != 7 {
		t.Errorf("extractions: got %d, want 7", n)
	}
	if strings.Contains(s, "(4 running)") || !strings.Contains(s, "all 7 extractions done, at most 3 at once") {
		t.Error("the semaphore let more than 3 run, or never 3")
	}
	for _, want := range []string{
		"consolidator cannot lock file set 42: 2 page locks below it",
		`editor-a cannot lock page 3 now: lock "fileset/42/page/3" conflicts with lock "fileset/42"`,
		"editor-a locks page 3",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if a, b := strings.Index(s, "editor-b is done with page 2"), strings.Index(s, "consolidator locks file set 42"); b < a {
		t.Error("the file-set lock was taken before the last page lock was released")
	}
}
