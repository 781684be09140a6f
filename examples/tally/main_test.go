package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), &out, 500*time.Millisecond, 20*time.Millisecond); err != nil {
		t.Fatalf("run: %v", err)
	}
	s := out.String()
	t.Log("\n" + s)
	for text, want := range map[string]int{
		"1 started the tally (202), 19 were refused (409)": 1,
		`held by \"svc-`:           1, // the 409's error names the holder
		"right after the cut: 409": 1,
		"after the cut: 202":       1,
	} {
		if n := strings.Count(s, text); n != want {
			t.Errorf("%q: got %d lines, want %d", text, n, want)
		}
	}
	// Progress from SetMetadata, read on the other server: the first
	// reading at or past 25 of 50 chunks (past it on a loaded machine).
	if !regexp.MustCompile(`status from svc-\w: running true, by \S+ on svc-\w, (2[5-9]|[34]\d)/50 chunks`).MatchString(s) {
		t.Errorf("no status line with the progress at 25 to 49 of 50 chunks, read on the other server")
	}
	// The cut-off tally stopped before the other server started over.
	stopped, restarted := strings.Index(s, "(term 1) stopped: lock"), strings.Index(s, "after the cut: 202")
	if stopped < 0 || restarted < 0 || stopped > restarted {
		t.Errorf("the cut-off tally's stop (at %d) is not reported before the new tally (at %d)", stopped, restarted)
	}
}

// The tests below are what a user of the lock writes for such a service:
// the memory backend instead of Redis or etcd, and a testing/synctest
// bubble, in which TTLs and renewals run on virtual time, instantly.

const testTTL = 3 * time.Second

func newTestServer(t *testing.T, b *memorybackend.Backend, id string) *server {
	t.Helper()
	l, err := lock.New(b, id, &lock.Options{TTL: testTTL, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s := &server{l: l, chunks: 50, chunk: 200 * time.Millisecond, say: func(string, ...any) {}}
	t.Cleanup(func() { l.Close(); s.wg.Wait() }) // inside the bubble: its goroutines end with it
	return s
}

func postTally(s *server, user string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/elections/7/tally", nil)
	r.Header.Set("X-User", user)
	w := httptest.NewRecorder()
	s.handler().ServeHTTP(w, r)
	return w
}

func getStatus(t *testing.T, s *server) status {
	t.Helper()
	w := httptest.NewRecorder()
	s.handler().ServeHTTP(w, httptest.NewRequest("GET", "/elections/7/tally", nil))
	var st status
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatalf("status body %q: %v", w.Body, err)
	}
	return st
}

func TestSecondRequestGets409NamingTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore() // created inside the bubble that uses it
		a := newTestServer(t, store.Client(), "svc-a")
		b := newTestServer(t, store.Client(), "svc-b")
		started := time.Now()
		if w := postTally(a, "alice"); w.Code != http.StatusAccepted {
			t.Fatalf("first request: got %d %s, want 202", w.Code, w.Body)
		}
		time.Sleep(5*200*time.Millisecond + time.Millisecond) // five chunks, in virtual time
		w := postTally(b, "bob")
		if w.Code != http.StatusConflict {
			t.Fatalf("second request: got %d %s, want 409", w.Code, w.Body)
		}
		var c conflict
		if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		if c.StartedBy != "alice" || c.Server != "svc-a" || !c.StartedAt.Equal(started) || c.Progress != "5/50 chunks" {
			t.Errorf("409: got %+v, want alice on svc-a since %v, 5/50 chunks", c, started)
		}
		if st := getStatus(t, b); !st.Running || st.By != "alice" || st.Progress != "5/50 chunks" {
			t.Errorf("status: got %+v, want alice's tally at 5/50 chunks", st)
		}
		a.wg.Wait() // the tally's 50 chunks pass in virtual time
		if w := postTally(b, "bob"); w.Code != http.StatusAccepted {
			t.Fatalf("request after the tally: got %d %s, want 202", w.Code, w.Body)
		}
	})
}

func TestFreeOneTTLAfterTheHolderStopsRenewing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ca := store.Client()
		a := newTestServer(t, ca, "svc-a")
		b := newTestServer(t, store.Client(), "svc-b")
		if w := postTally(a, "alice"); w.Code != http.StatusAccepted {
			t.Fatalf("first request: got %d %s, want 202", w.Code, w.Body)
		}
		time.Sleep(time.Second)
		stopped := make(chan time.Time, 1)
		go func() { a.wg.Wait(); stopped <- time.Now() }()
		ca.Partition() // svc-a renews nothing from now on, as if it had crashed
		cut := time.Now()
		// Its last renewal was sent at most RenewInterval (TTL/2) before
		// the cut, and the store keeps the lock one TTL after it.
		time.Sleep(testTTL - testTTL/2 - time.Millisecond)
		if w := postTally(b, "bob"); w.Code != http.StatusConflict {
			t.Fatalf("request %v after svc-a stopped renewing: got %d %s, want 409", time.Since(cut), w.Code, w.Body)
		}
		time.Sleep(testTTL/2 + 2*time.Millisecond) // one TTL after the cut
		if w := postTally(b, "bob"); w.Code != http.StatusAccepted {
			t.Fatalf("request one TTL after svc-a stopped renewing: got %d %s, want 202", w.Code, w.Body)
		}
		select {
		case at := <-stopped: // svc-a's tally stopped at its renew deadline, before the store let go
			if rd := a.l.Options().RenewDeadline; at.Sub(cut) > rd {
				t.Errorf("svc-a's tally stopped %v after the cut, want within RenewDeadline %v", at.Sub(cut), rd)
			}
		default:
			t.Error("svc-a's tally still runs after svc-b took the lock")
		}
		if st := getStatus(t, b); st.By != "bob" || st.Server != "svc-b" {
			t.Errorf("status: got %+v, want bob on svc-b", st)
		}
	})
}

// After a restart that may have lost the lease (redisbackend's RestartGuard;
// RestartOptions.Guard here), the store refuses the key without a holder to
// name: 503 with Retry-After, then 202 once the refusal ends.
func TestRestartGuardGets503(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		b := newTestServer(t, store.Client(), "svc-b")
		store.Restart(&memorybackend.RestartOptions{Guard: testTTL})
		w := postTally(b, "bob")
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "4" {
			t.Fatalf("request right after the restart: got %d, Retry-After %q, %s; want 503, Retry-After 4", w.Code, w.Header().Get("Retry-After"), w.Body)
		}
		time.Sleep(testTTL)
		if w := postTally(b, "bob"); w.Code != http.StatusAccepted {
			t.Fatalf("request once the refusal ended: got %d %s, want 202", w.Code, w.Body)
		}
	})
}
