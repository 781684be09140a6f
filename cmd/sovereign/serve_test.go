package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
	"github.com/sovereign-go/sovereign/memorybackend"
)

var updateScreenshot = flag.Bool("screenshot", false, "write the status page's screenshot to testdata/status-page.png")

// startServe runs the status server in-process on a shared memory store.
func startServe(t *testing.T, b backend.Backend, names ...string) *httptest.Server {
	t.Helper()
	s := newServer(b, serverOptions{label: "memory://", names: names, interval: time.Second, forget: time.Hour, timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.run(ctx) })
	hs := httptest.NewServer(s.handler())
	t.Cleanup(func() {
		cancel()
		hs.CloseClientConnections()
		hs.Close()
		wg.Wait()
	})
	return hs
}

func acquire(t *testing.T, b backend.Backend, key, id string, ttl time.Duration, md map[string]string) backend.Lease {
	t.Helper()
	l, err := b.Acquire(context.Background(), backend.AcquireRequest{Key: key, HolderID: id, TTL: ttl, Metadata: md})
	if err != nil {
		t.Fatalf("acquire %q as %q: %v", key, id, err)
	}
	return l
}

// acquireShared takes a Shared hold with limit on the lock key by id.
func acquireShared(t *testing.T, b backend.Modes, key, id string, limit int, md map[string]string) backend.Lease {
	t.Helper()
	l, err := b.AcquireMode(context.Background(), backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: key, HolderID: id, TTL: time.Minute, Metadata: md},
		Mode:           backend.Shared, Limit: limit,
	})
	if err != nil {
		t.Fatalf("shared acquire %q as %q: %v", key, id, err)
	}
	return l
}

// holdersJS returns an expression: the holder IDs the card of key lists.
func holdersJS(key string) string {
	k, _ := json.Marshal(key)
	return fmt.Sprintf(`[...document.querySelectorAll('section[data-key=' + JSON.stringify(%s) + '] .holders li')].map(li => li.dataset.holder).join(",")`, k)
}

// waitHoldersJS returns a promise that resolves once the card of key lists
// the holders want (IDs joined by commas), and rejects after 20 s.
func waitHoldersJS(key, want string) string {
	w, _ := json.Marshal(want)
	return fmt.Sprintf(`new Promise((resolve, reject) => {
		const check = () => (%s) === %s;
		if (check()) return resolve(true);
		const obs = new MutationObserver(() => { if (check()) { obs.disconnect(); resolve(true); } });
		obs.observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
		setTimeout(() => { obs.disconnect(); reject(new Error("the page did not list holders " + %s + ": " + (document.body ? document.body.innerText : "(no body)"))); }, 20000);
	})`, holdersJS(key), w, w)
}

func heartbeat(t *testing.T, b backend.Backend, key string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := b.Heartbeat(context.Background(), key, id, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}

// TestServeBrowser loads the status page in headless Chromium and checks
// that it shows a leader change, pushed over server-sent events, within a
// second of the change, without reloading the page.
func TestServeBrowser(t *testing.T) {
	br := startBrowser(t)
	store := memorybackend.NewStore()
	b := store.Client()
	defer b.Close()
	heartbeat(t, b, "billing-cron", "web-1", "web-2", "web-3")
	la := acquire(t, b, "billing-cron", "web-1", 30*time.Second, map[string]string{"version": "1.4.2"})
	acquire(t, b, "nightly-report", "batch-7", 20*time.Second, nil) // no heartbeat: a stale warning
	heartbeat(t, b, lockPrefix+"db-migrate", "deploy-42")
	acquire(t, b, lockPrefix+"db-migrate", "deploy-42", 15*time.Second, map[string]string{"migration": "0042_add_index"})
	ra := acquireShared(t, b, lockPrefix+"reports/read", "report-a", 3, map[string]string{"report": "daily"})
	acquireShared(t, b, lockPrefix+"reports/read", "report-b", 3, nil)
	hs := startServe(t, b, "payments-sweeper") // never held: shown as "no leader"

	if err := br.call("Page.navigate", map[string]any{"url": hs.URL + "/"}, nil); err != nil {
		t.Fatal(err)
	}
	// Mark the page so a reload would be noticed.
	if _, err := br.eval(waitHolderJS("billing-cron", "web-1") + `.then(() => { window.__notReloaded = true; return true; })`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, holder string }{
		{"nightly-report", "batch-7"},
		{lockPrefix + "db-migrate", "deploy-42"},
		{"payments-sweeper", ""},
	} {
		if _, err := br.eval(waitHolderJS(tc.key, tc.holder)); err != nil {
			t.Fatalf("%s: %v", tc.key, err)
		}
	}
	// A shared lock: the card lists every holder, oldest first.
	if _, err := br.eval(waitHoldersJS(lockPrefix+"reports/read", "report-a,report-b")); err != nil {
		t.Fatal(err)
	}
	v, err := br.eval(`document.querySelector('section[data-key="lock/reports/read"] .holder').textContent`)
	if err != nil || string(v) != `"2 shared holders of 3"` {
		t.Errorf("got the shared lock's headline %s (%v), want \"2 shared holders of 3\"", v, err)
	}
	v, err = br.eval(`document.querySelector('section[data-key="lock/reports/read"] .holders li[data-holder="report-a"]').textContent`)
	if err != nil || !strings.Contains(string(v), "shared, limit 3, term ") || !strings.Contains(string(v), "report=daily") || !strings.Contains(string(v), "left") {
		t.Errorf("got report-a's line %s (%v), want its mode, limit, term, TTL left and metadata", v, err)
	}
	// One holder leaves and another comes: pushed to the page.
	if err := b.Release(context.Background(), ra); err != nil {
		t.Fatal(err)
	}
	acquireShared(t, b, lockPrefix+"reports/read", "report-c", 3, nil)
	if _, err := br.eval(waitHoldersJS(lockPrefix+"reports/read", "report-b,report-c")); err != nil {
		t.Fatal(err)
	}

	v, err = br.eval(`document.querySelector('section[data-key="nightly-report"] .warning')?.textContent ?? ""`)
	if err != nil || !strings.Contains(string(v), "no live heartbeat") {
		t.Errorf("got nightly-report warning %s (%v), want one about the missing heartbeat", v, err)
	}
	v, err = br.eval(`document.querySelector('section[data-key="payments-sweeper"] .holder').textContent`)
	if err != nil || string(v) != `"no leader"` {
		t.Errorf("got payments-sweeper holder %s (%v), want \"no leader\"", v, err)
	}

	// The change: web-1 resigns, web-2 takes over.
	changed := time.Now()
	if err := b.Release(context.Background(), la); err != nil {
		t.Fatal(err)
	}
	acquire(t, b, "billing-cron", "web-2", 30*time.Second, map[string]string{"version": "1.4.2"})
	if _, err := br.eval(waitHolderJS("billing-cron", "web-2")); err != nil {
		t.Fatal(err)
	}
	shown := time.Since(changed)
	t.Logf("the page showed the new leader %v after the change", shown)
	if shown > time.Second {
		t.Errorf("the page showed the new leader %v after the change, want within 1s", shown)
	}
	if v, err := br.eval(`window.__notReloaded === true`); err != nil || string(v) != "true" {
		t.Errorf("got page marker %s (%v): the page was reloaded, want a live update", v, err)
	}

	png, err := br.screenshot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "status-page.png")
	if *updateScreenshot {
		path = filepath.Join("testdata", "status-page.png")
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// waitHolderJS returns a promise that resolves once the card of key shows
// holder ("" for no leader), and rejects after 20 s.
func waitHolderJS(key, holder string) string {
	k, _ := json.Marshal(key)
	h, _ := json.Marshal(holder)
	return fmt.Sprintf(`new Promise((resolve, reject) => {
		const check = () => {
			const el = document.querySelector('section[data-key=' + JSON.stringify(%s) + '] .holder');
			return el && el.dataset.holder === %s;
		};
		if (check()) return resolve(true);
		const obs = new MutationObserver(() => { if (check()) { obs.disconnect(); resolve(true); } });
		obs.observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
		setTimeout(() => { obs.disconnect(); reject(new Error("the page did not show holder " + %s + " of " + %s + ": " + (document.body ? document.body.innerText : "(no body)"))); }, 20000);
	})`, k, h, h, k)
}

// TestServeHTTP checks /healthz, /metrics, /api/state and the event stream
// without a browser.
func TestServeHTTP(t *testing.T) {
	store := memorybackend.NewStore()
	b := store.Client()
	defer b.Close()
	heartbeat(t, b, "job", "a", "b")
	acquire(t, b, "job", "a", time.Minute, nil)
	acquire(t, b, lockPrefix+"x/y", "h", time.Minute, nil)
	sa := acquireShared(t, b, lockPrefix+"sem", "reader-a", 2, map[string]string{"job": "a"})
	sb := acquireShared(t, b, lockPrefix+"sem", "reader-b", 2, nil)
	hs := startServe(t, b, "idle")

	get := func(path string) (int, string) {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// Wait for the first snapshot that has read the backend.
	events := subscribeEvents(t, hs.URL)
	snap := events.next(func(s snapshot) bool { return s.OK })
	if len(snap.Entries) != 4 {
		t.Fatalf("got %d entries, want 4 (job, idle, locks sem and x/y): %+v", len(snap.Entries), snap.Entries)
	}
	// The shared lock: every holder, in term order; the entry's own fields
	// are the oldest's.
	for _, e := range snap.Entries {
		if e.Key != lockPrefix+"sem" {
			continue
		}
		if !e.Held || e.Holder != "reader-a" || e.Term != sa.Term || e.Mode != "shared" || e.Limit != 2 || len(e.Holders) != 2 {
			t.Fatalf("lock sem: got %+v, want held by reader-a (the oldest, term %d), shared, limit 2, with 2 holders", e, sa.Term)
		}
		for i, l := range []backend.Lease{sa, sb} {
			h := e.Holders[i]
			if h.ID != l.HolderID || h.Term != l.Term || h.Mode != "shared" || h.Limit != 2 || h.TTLSeconds <= 0 || h.Since == nil {
				t.Errorf("lock sem holder %d: got %+v, want %s, term %d, shared, limit 2, TTL and since", i, h, l.HolderID, l.Term)
			}
		}
		if e.Holders[0].Metadata["job"] != "a" {
			t.Errorf("lock sem holder 0: got metadata %v, want job=a", e.Holders[0].Metadata)
		}
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("got /healthz %d %q, want 200 ok", code, body)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{
		"# TYPE sovereign_election_held gauge",
		`sovereign_election_held{name="job",kind="election"} 1`,
		`sovereign_election_held{name="idle",kind="election"} 0`,
		`sovereign_election_held{name="x/y",kind="lock"} 1`,
		`sovereign_election_term{name="job",kind="election"} `,
		`sovereign_election_ttl_seconds{name="job",kind="election"} `,
		`sovereign_election_members{name="job",kind="election"} 2`,
		`sovereign_election_holder_info{name="job",kind="election",holder="a"} 1`,
		`sovereign_election_holder_info{name="sem",kind="lock",holder="reader-a"} 1`,
		`sovereign_election_holder_info{name="sem",kind="lock",holder="reader-b"} 1`,
		`sovereign_election_holders{name="sem",kind="lock"} 2`,
		`sovereign_election_holders{name="x/y",kind="lock"} 1`,
		`sovereign_election_holders{name="idle",kind="election"} 0`,
		"sovereign_up 1",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	code, page := get("/")
	if code != 200 || !strings.Contains(page, "<title>Sovereign status</title>") {
		t.Errorf("got / %d, want the page", code)
	}

	// A backend that fails: /healthz turns 503.
	b.Partition()
	defer b.Heal()
	events.next(func(s snapshot) bool { return !s.OK })
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "unreachable") {
		t.Fatalf("got /healthz %d %q with the backend partitioned, want 503", code, body)
	}
}

// eventStream reads snapshots from /events.
type eventStream struct {
	t     *testing.T
	snaps chan snapshot
}

func subscribeEvents(t *testing.T, base string) *eventStream {
	t.Helper()
	resp, err := http.Get(base + "/events")
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("got /events content type %q, want text/event-stream", ct)
	}
	es := &eventStream{t: t, snaps: make(chan snapshot, 64)}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(es.snaps)
		// As an EventSource does, an event counts once the blank line that
		// ends it has arrived: a connection closed in the middle of one (the
		// server shutting down at the end of the test) leaves an incomplete
		// event, which is dropped, not a malformed one.
		r := bufio.NewReaderSize(resp.Body, 1<<16)
		var data string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = d
				continue
			}
			if line != "" || data == "" {
				continue
			}
			var s snapshot
			if err := json.Unmarshal([]byte(data), &s); err != nil {
				t.Errorf("event %q: %v", data, err)
				return
			}
			data = ""
			es.snaps <- s
		}
	})
	t.Cleanup(func() {
		resp.Body.Close()
		for range es.snaps {
		}
		wg.Wait()
	})
	return es
}

// next returns the next snapshot for which ok returns true.
func (es *eventStream) next(ok func(snapshot) bool) snapshot {
	es.t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case s, open := <-es.snaps:
			if !open {
				es.t.Fatal("event stream ended")
			}
			if ok(s) {
				return s
			}
		case <-timeout:
			es.t.Fatalf("no matching snapshot within %v", wait)
		}
	}
}

func TestPrometheusLabel(t *testing.T) {
	if got, want := label("a\"b\\c\nd"), `"a\"b\\c\nd"`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestServeBinary runs `sovereign serve --demo` on the memory backend: the
// page's data, /healthz and /metrics, then a clean exit on SIGTERM.
func TestServeBinary(t *testing.T) {
	p := start(t, nil, "--backend", "memory://", "serve", "--demo", "--http", "127.0.0.1:0")
	line := p.waitLog("serving the status of memory:// on ")
	base := strings.TrimSuffix(line[strings.Index(line, "http://"):], "/")
	events := subscribeEvents(t, base)
	events.next(func(s snapshot) bool {
		held, readers := 0, 0
		for _, e := range s.Entries {
			if e.Held {
				held++
			}
			if e.Name == "reports/read" {
				readers = len(e.Holders)
			}
		}
		// billing-cron, nightly-report, locks db-migrate and reports/read
		// (two holders)
		return s.OK && held == 4 && readers == 2
	})
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sovereign_election_held{name="billing-cron",kind="election"} 1`,
		`sovereign_election_held{name="db-migrate",kind="lock"} 1`,
		`sovereign_election_holders{name="reports/read",kind="lock"} 2`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	resp, err = http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("got /healthz %d, want 200", resp.StatusCode)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("got exit %d after SIGTERM, want 0", code)
	}
}

// TestServeRedis runs `sovereign serve` on Redis, reading the backend only
// every hour: a change of holder of a key it shows, made by another client,
// must reach the event stream through the backend's watch.
func TestServeRedis(t *testing.T) {
	_, env, b := redisEnv(t)
	la := acquire(t, b, "app/job", "a", time.Minute, nil)
	p := start(t, env, "serve", "--http", "127.0.0.1:0", "--prefix", "app/", "--interval", "1h")
	line := p.waitLog("on http://")
	base := strings.TrimSuffix(line[strings.Index(line, "http://"):], "/")
	events := subscribeEvents(t, base)
	holderOf := func(s snapshot, key string) string {
		for _, e := range s.Entries {
			if e.Key == key {
				return e.Holder
			}
		}
		return "(absent)"
	}
	events.next(func(s snapshot) bool { return s.OK && holderOf(s, "app/job") == "a" })
	if err := b.Release(context.Background(), la); err != nil {
		t.Fatal(err)
	}
	events.next(func(s snapshot) bool { return holderOf(s, "app/job") == "" })
	acquire(t, b, "app/job", "b", time.Minute, nil)
	events.next(func(s snapshot) bool { return holderOf(s, "app/job") == "b" })
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("got serve exit %d after SIGTERM, want 0", code)
	}
}

// TestServeEtcdHolderHeartbeat runs the status server on etcd, whose List
// records carry no heartbeat: the holder's heartbeat must still show, from
// its member record, and the page must not warn that the holder has none
// (every etcd election showed "heartbeat none" and that warning).
func TestServeEtcdHolderHeartbeat(t *testing.T) {
	cluster := testetcd.Start(t)
	b, err := etcdbackend.New(cluster.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	heartbeat(t, b, "job", "a", "b")
	acquire(t, b, "job", "a", time.Minute, nil)
	acquire(t, b, "orphan", "c", time.Minute, nil) // no heartbeat: the warning stays
	hs := startServe(t, b)
	snap := subscribeEvents(t, hs.URL).next(func(s snapshot) bool { return s.OK && len(s.Entries) == 2 })
	for _, e := range snap.Entries {
		switch e.Key {
		case "job":
			if e.Holder != "a" || e.LastHeartbeat == nil || e.HeartbeatAgeSeconds == nil || len(e.Warnings) != 0 {
				t.Errorf("job: got holder %q, heartbeat %v, warnings %q; want a, its heartbeat, no warning", e.Holder, e.LastHeartbeat, e.Warnings)
			}
		case "orphan":
			if e.LastHeartbeat != nil || len(e.Warnings) != 1 || !strings.Contains(e.Warnings[0], "no live heartbeat") {
				t.Errorf("orphan: got heartbeat %v, warnings %q; want none and the missing-heartbeat warning", e.LastHeartbeat, e.Warnings)
			}
		default:
			t.Errorf("got entry %q, want job and orphan only", e.Key)
		}
	}
}
