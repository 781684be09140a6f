package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []string{
		`proc-1: lock "bob/exports/tenant-9" held by 2 shared holders (limit 2)`,
		`List("alice/"): 4 holders`,
		`List("alice"): 5 holders`,
		"alice   2 keys, 4 holders (3 shared, 1 exclusive), oldest proc-1 on alice/edits/doc-1",
		"alicex  1 keys, 1 holders (0 shared, 1 exclusive)",
		"bob     1 keys, 2 holders (2 shared, 0 exclusive), oldest proc-2 on bob/exports/tenant-9",
		"carol   1 keys, 1 holders (0 shared, 1 exclusive), oldest proc-3 on carol:edits:doc-3",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
