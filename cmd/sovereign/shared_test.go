package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestSharedLockRedis runs lock --shared --limit 2 on a real redis-server.
func TestSharedLockRedis(t *testing.T) {
	_, env, b := redisEnv(t)
	testSharedLock(t, env, b)
}

// TestSharedLockEtcd runs lock --shared --limit 2 on an embedded etcd.
func TestSharedLockEtcd(t *testing.T) {
	cluster := testetcd.Start(t)
	b, err := etcdbackend.New(cluster.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	env := []string{"SOVEREIGN_BACKEND=etcd://" + strings.TrimPrefix(cluster.Endpoint(0), "http://")}
	testSharedLock(t, env, b)
}

// testSharedLock runs two commands at once under `lock --shared --limit 2`:
// a third shared holder, an exclusive one and one with another limit are
// refused (75, naming both holders; 64 for the limit), status and list show
// both holders with their mode, and once one holder's command has exited
// the third gets in. Then a hierarchical lock below a key keeps an
// exclusive hierarchical lock on the key out.
func testSharedLock(t *testing.T, env []string, b backend.Backend) {
	kids := newChildren(t)
	holderA := start(t, append(env, kids.env("hold")...),
		"lock", "--ttl", "2s", "--id", "reader-a", "--shared", "--limit", "2", "--metadata", "job=a", "sem", "--", os.Args[0])
	kids.expect(0, "start")
	kids.expect(0, "ready")
	holderB := start(t, append(env, kids.env("hold")...),
		"lock", "--ttl", "2s", "--id", "reader-b", "--shared", "--limit", "2", "sem", "--", os.Args[0])
	kids.expect(1, "start")
	kids.expect(1, "ready") // both commands run at once

	var recs []backend.Record
	if m, ok := b.(backend.Modes); !ok {
		t.Fatal("the backend has no backend.Modes")
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		var err error
		recs, err = m.Holders(ctx, lockPrefix+"sem")
		cancel()
		if err != nil || len(recs) != 2 {
			t.Fatalf("Holders: got %d records (err %v), want 2", len(recs), err)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{
			name: "a third shared holder",
			args: []string{"--shared", "--limit", "2"},
			code: exitHeld,
			want: []string{`lock "sem" is held by 2 holders:`, "reader-a (shared, limit 2, term", "reader-b (shared, limit 2, term", "job=a", " ago, ", "left)"},
		},
		{
			name: "an exclusive holder",
			args: nil,
			code: exitHeld,
			want: []string{`lock "sem" is held by 2 holders:`, "reader-a (shared", "reader-b (shared"},
		},
		{
			name: "a shared holder with another limit",
			args: []string{"--shared", "--limit", "3"},
			code: exitUsage,
			want: []string{"limit", "another --limit"},
		},
		{
			name: "a limit without --shared",
			args: []string{"--limit", "2"},
			code: exitUsage,
			want: []string{"--limit is for --shared locks only"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"lock", "--try", "--id", "reader-c"}, tc.args...)
			code, out, stderr := run(t, env, append(args, "sem", "--", "echo", "ran")...)
			if code != tc.code || out != "" {
				t.Fatalf("got exit %d, output %q, stderr %q; want %d and no output", code, out, stderr, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("got stderr %q, want it to contain %q", stderr, w)
				}
			}
		})
	}
	t.Run("status", func(t *testing.T) {
		code, out, stderr := run(t, env, "status", "--lock", "-o", "json", "sem")
		var e entry
		if err := json.Unmarshal([]byte(out), &e); err != nil || code != 0 {
			t.Fatalf("got exit %d, %v: %s %s", code, err, out, stderr)
		}
		if e.Mode != "shared" || e.Limit != 2 || e.Holder != "reader-a" || len(e.Holders) != 2 {
			t.Fatalf("got %+v, want mode shared, limit 2, holder reader-a and 2 holders", e)
		}
		for i, want := range []string{"reader-a", "reader-b"} {
			h := e.Holders[i]
			if h.ID != want || h.Mode != "shared" || h.Limit != 2 || h.Term != recs[i].Term || h.TTLSeconds <= 0 || h.Since == nil {
				t.Errorf("holder %d: got %+v, want %s, shared, limit 2, term %d, TTL and since", i, h, want, recs[i].Term)
			}
		}
		code, out, _ = run(t, env, "status", "--lock", "sem")
		for _, want := range []string{"mode", "shared (limit 2)", "holders", "reader-a (shared, limit 2", "reader-b (shared, limit 2"} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("status printed (exit %d):\n%s\nwant it to contain %q", code, out, want)
			}
		}
	})
	t.Run("list", func(t *testing.T) {
		code, out, stderr := run(t, env, "list", "lock/")
		if code != 0 {
			t.Fatalf("got exit %d: %s", code, stderr)
		}
		for _, want := range []string{"lock  sem   reader-a", "lock  sem   reader-b", "shared/2"} {
			if !strings.Contains(out, want) {
				t.Errorf("list printed:\n%s\nwant it to contain %q", out, want)
			}
		}
	})

	// The first holder's command ends: its permit is free at once.
	holderA.signal(syscall.SIGTERM)
	kids.expect(0, "signal terminated")
	if code := holderA.wait(); code != 42 {
		t.Fatalf("got holder exit %d, want the command's 42", code)
	}
	if l := kids.next("the first command's end"); l.conn != 0 || !l.eof {
		t.Fatalf("got child line %+v, want the end of child 0", l)
	}
	if code, out, stderr := run(t, env, "lock", "--try", "--id", "reader-c", "--shared", "--limit", "2", "sem", "--", "echo", "ran"); code != 0 || out != "ran\n" {
		t.Fatalf("got exit %d, output %q, stderr %q with one permit free; want 0 and \"ran\"", code, out, stderr)
	}
	holderB.signal(syscall.SIGTERM)
	kids.expect(1, "signal terminated")
	if code := holderB.wait(); code != 42 {
		t.Fatalf("got holder exit %d, want the command's 42", code)
	}
	if l := kids.next("the second command's end"); l.conn != 1 || !l.eof {
		t.Fatalf("got child line %+v, want the end of child 1", l)
	}

	// Hierarchy: a lock on a page takes intent on its file set.
	page := start(t, append(env, kids.env("hold")...),
		"lock", "--ttl", "2s", "--id", "writer-p", "--hierarchical", "files/set1/page1", "--", os.Args[0])
	kids.expect(2, "start")
	kids.expect(2, "ready")
	code, out, stderr := run(t, env, "lock", "--try", "--id", "writer-s", "--hierarchical", "files/set1", "--", "echo", "ran")
	if code != exitHeld || out != "" || !strings.Contains(stderr, `lock "files/set1/page1": writer-p (exclusive`) {
		t.Fatalf("exclusive lock above a page lock: got exit %d, output %q, stderr %q; want %d naming the page lock", code, out, stderr, exitHeld)
	}
	if code, out, stderr := run(t, env, "lock", "--try", "--id", "writer-q", "--hierarchical", "files/set1/page2", "--", "echo", "ran"); code != 0 || out != "ran\n" {
		t.Fatalf("another page: got exit %d, output %q, stderr %q; want 0 and \"ran\"", code, out, stderr)
	}
	// An exclusive lock waiting above keeps new page locks out (when the
	// backend has the rule), and runs once the page lock is gone.
	var above *proc
	if m, ok := b.(backend.Modes); ok && m.ModeSupport().AncestorWaiters {
		above = start(t, env, "lock", "--ttl", "2s", "--id", "writer-s", "--hierarchical", "--wait", wait.String(), "files/set1", "--", "echo", "served")
		deadline := time.Now().Add(wait)
		for {
			code, _, stderr := run(t, env, "lock", "--try", "--id", "writer-r", "--hierarchical", "files/set1/page3", "--", "echo", "ran")
			if code == exitHeld && strings.Contains(stderr, `lock "files/set1/page3" has 1 exclusive waiting ahead on lock "files/set1"`) {
				break
			}
			if code != 0 && code != exitHeld || time.Now().After(deadline) {
				t.Fatalf("a page lock while an exclusive lock waits for files/set1: got exit %d, stderr %q; want %d naming the waiter within %v", code, stderr, exitHeld, wait)
			}
			time.Sleep(20 * time.Millisecond) // polling for the waiter's registration, an observable condition
		}
	} else {
		t.Logf("the backend's ModeSupport lacks AncestorWaiters: an exclusive waiter above does not keep page locks out; not checked")
	}
	page.signal(syscall.SIGTERM)
	kids.expect(2, "signal terminated")
	if code := page.wait(); code != 42 {
		t.Fatalf("got page holder exit %d, want the command's 42", code)
	}
	if l := kids.next("the page command's end"); l.conn != 2 || !l.eof {
		t.Fatalf("got child line %+v, want the end of child 2", l)
	}
	if above != nil {
		if code := above.wait(); code != 0 || above.stdoutText() != "served\n" {
			t.Fatalf("the exclusive lock above: got exit %d, output %q; want 0 and \"served\"", code, above.stdoutText())
		}
	}

	// Fair: a --fair waiter keeps its place; a later --fair --try is told
	// that someone waits ahead, and the waiter is served when the holder
	// is done.
	holder := start(t, append(env, kids.env("hold")...), "lock", "--ttl", "2s", "--id", "holder-q", "queue", "--", os.Args[0])
	kids.expect(3, "start")
	kids.expect(3, "ready")
	waiter := start(t, env, "lock", "--ttl", "2s", "--id", "waiter-1", "--fair", "--wait", wait.String(), "queue", "--", "echo", "served")
	deadline := time.Now().Add(wait)
	for {
		code, _, stderr := run(t, env, "lock", "--try", "--fair", "--id", "waiter-2", "queue", "--", "echo", "ran")
		if code != exitHeld {
			t.Fatalf("a later --fair --try while queue is held: got exit %d (%q), want %d", code, stderr, exitHeld)
		}
		if strings.Contains(stderr, "1 waiting ahead") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the --fair waiter was not seen waiting within %v; the last --try said %q", wait, stderr)
		}
		time.Sleep(20 * time.Millisecond) // polling for the waiter's registration, an observable condition
	}
	holder.signal(syscall.SIGTERM)
	if code := holder.wait(); code != 42 {
		t.Fatalf("got holder exit %d, want the command's 42", code)
	}
	if code := waiter.wait(); code != 0 || waiter.stdoutText() != "served\n" {
		t.Fatalf("got waiter exit %d, output %q; want 0 and \"served\"", code, waiter.stdoutText())
	}
}

// noModes is a backend without backend.Modes (nor a watch).
type noModes struct{ backend.Backend }

// TestLockUnsupportedOptions: `lock` with an option the backend cannot
// serve exits 64 (usage) and never runs the command: no silent exclusive
// lock.
func TestLockUnsupportedOptions(t *testing.T) {
	store := memorybackend.NewStore()
	c := store.Client()
	defer c.Close()
	for _, opt := range []string{"--shared", "--hierarchical", "--fair"} {
		t.Run(opt, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			var errb bytes.Buffer
			e := &env{stdout: io.Discard, stderr: &errb, openHook: func() (*opened, error) {
				return &opened{Backend: noModes{c}, close: func() {}, redacted: "memory://"}, nil
			}}
			code := mainArgs(t.Context(), e, []string{"lock", "--try", opt, "files/set1", "--", "touch", marker})
			if code != exitUsage || !strings.Contains(errb.String(), "the backend cannot serve") {
				t.Errorf("got exit %d, stderr %q; want %d saying the backend cannot serve it", code, errb.String(), exitUsage)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the command ran under a lock the backend cannot serve")
			}
		})
	}
}
