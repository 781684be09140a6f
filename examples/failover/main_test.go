package main

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The demo shows a crash failover with a higher term, then a hand-over.
func TestDemoShowsFailoverAndHandover(t *testing.T) {
	var out bytes.Buffer
	const ttl = 500 * time.Millisecond
	if err := run(t.Context(), &out, ttl); err != nil {
		t.Fatalf("run: %v", err)
	}
	s := out.String()
	for _, re := range []string{
		`LEADER, term 1\n`,
		`\*\*\* n\d crashes`,
		`LEADER, term 2\n`,
		`stopped leading term 2: resigned`,
		`LEADER, term 3\n`,
		`crash failover: n\d took over \(term 2\) [0-9.]+m?s after n\d crashed \(TTL 500ms\)`,
		`graceful hand-over: n\d took over \(term 3\) [0-9.]+[µm]?s after n\d resigned`,
	} {
		if !regexp.MustCompile(re).MatchString(s) {
			t.Errorf("output lacks %q; output:\n%s", re, s)
		}
	}
}
