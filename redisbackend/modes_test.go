package redisbackend_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestModesLayout: a hierarchical lock keeps its entry in its own lease
// hash and an intent in each ancestor's, all under the tree's hash tag;
// a waiter is a ticket in the key's waiters hash; once the lock is released
// and the wait cancelled, only the term counter is left.
func TestModesLayout(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "ml:"})
	const (
		root = "ml:{lock/t}{}"
		mid  = "ml:{lock/t}{/a}"
		leaf = "ml:{lock/t}{/a/b}"
	)
	l, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/t/a/b", HolderID: "w", TTL: 30 * time.Second,
			Metadata: map[string]string{"m": "v"}},
		Ancestors: []string{"lock/t", "lock/t/a"},
	})
	if err != nil {
		t.Fatalf("AcquireMode: %v", err)
	}
	if l.Entry == nil || l.Entry.Mode != backend.Exclusive || !slices.Equal(l.Entry.Ancestors, []string{"lock/t", "lock/t/a"}) {
		t.Fatalf("lease Entry: got %+v, want Exclusive with both ancestors", l.Entry)
	}
	fields := func(name string) []string {
		h, err := c.HGetAll(ctx, name).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", name, err)
		}
		var fs []string
		for f := range h {
			fs = append(fs, f)
		}
		sort.Strings(fs)
		return fs
	}
	for name, want := range map[string][]string{
		leaf: {"h:" + l.Token, "modes"},
		mid:  {"i:" + l.Token, "modes"},
		root: {"i:" + l.Token, "modes"},
	} {
		if got := fields(name); !slices.Equal(got, want) {
			t.Errorf("fields of %s: got %q, want %q", name, got, want)
		}
		if pttl := c.PTTL(ctx, name).Val(); pttl <= 29*time.Second || pttl > 30*time.Second {
			t.Errorf("PTTL %s: got %v, want about 30s (the entry's TTL)", name, pttl)
		}
	}
	if got := c.Get(ctx, leaf+":term").Val(); got != strconv.FormatUint(l.Term, 10) {
		t.Errorf("GET %s:term: got %q, want %d", leaf, got, l.Term)
	}
	// A reader that waits fairly is a ticket of the key's waiters hash.
	_, err = b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/t/a/b", HolderID: "r", TTL: 20 * time.Second},
		Mode:           backend.Shared, Fair: true, WaitID: "wait-1", Ancestors: []string{"lock/t", "lock/t/a"},
	})
	if !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	w := c.HGetAll(ctx, leaf+":waiters").Val()
	if w["seq"] != "1" || !strings.HasPrefix(w["w:wait-1"], "1 ") || !strings.HasSuffix(w["w:wait-1"], " s") {
		t.Errorf("HGETALL %s:waiters: got %v, want seq=1 and w:wait-1=\"1 <expiry> s\"", leaf, w)
	}
	if pttl := c.PTTL(ctx, leaf+":waiters").Val(); pttl <= 19*time.Second || pttl > 20*time.Second {
		t.Errorf("PTTL %s:waiters: got %v, want about 20s (the waiter's TTL)", leaf, pttl)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := b.CancelWait(ctx, "lock/t/a/b", "wait-1"); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	keys := c.Keys(ctx, "ml:*").Val() // test code on a test server
	if want := []string{leaf + ":term"}; !slices.Equal(keys, want) {
		t.Errorf("keys after Release and CancelWait: got %q, want %q (the term counter only)", keys, want)
	}
}

// TestModesTreeOneSlot: on Cluster, every name of a lock tree hashes to
// its root's slot, so one script reaches a lock and its ancestors (the
// conformance run of TestCluster takes hierarchical locks through a
// ClusterClient); an ancestor in another slot is refused up front.
func TestModesTreeOneSlot(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	admin := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	slot := func(name string) int64 {
		n, err := admin.ClusterKeySlot(ctx, name).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", name, err)
		}
		return n
	}
	want := slot("p:{lock/root}{}")
	for _, name := range []string{"p:{lock/root}{/a}", "p:{lock/root}{/a/b:c}:term", "p:{lock/root}{/a/b}:waiters",
		"p:{lock/root}{/a/b}:heartbeat:x}", "p:{lock/root}{/a/b}:events"} {
		if got := slot(name); got != want {
			t.Errorf("slot of %s: got %d, want %d (its root's)", name, got, want)
		}
	}
	b := newBackend(t, srv.NewClusterClient(t, nil), &redisbackend.Options{Prefix: "p:"})
	_, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/abc", HolderID: "x", TTL: time.Minute},
		Ancestors:      []string{"lock/ab"},
	})
	if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "hash slot") {
		t.Fatalf("AcquireMode with an ancestor of another root on Cluster: got %v, want ErrInvalid naming the hash slot", err)
	}
	l, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/root/a/b", HolderID: "x", TTL: time.Minute},
		Ancestors:      []string{"lock/root", "lock/root/a"},
	})
	if err != nil {
		t.Fatalf("AcquireMode of a tree on Cluster: %v", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestModesRoundTrips: every operation of backend.Modes, and Renew,
// Release, SetMetadata and Get of an entry, is one round trip (once the
// script is loaded); the commands each runs on the server are logged (go
// test -v -run TestModesRoundTrips ./redisbackend/).
func TestModesRoundTrips(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	hook := &countHook{}
	c.AddHook(hook)
	admin := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "mrt:"})
	req := func(key, id string, m backend.Mode, limit int, anc ...string) backend.ModeRequest {
		return backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: key, HolderID: id, TTL: time.Minute,
			Metadata: map[string]string{"a": "1"}}, Mode: m, Limit: limit, Ancestors: anc}
	}
	var s1, s2, x, page backend.Lease
	held := func(err error) error {
		if errors.Is(err, backend.ErrHeld) {
			return nil
		}
		return fmt.Errorf("got %v, want ErrHeld", err)
	}
	ops := []struct {
		name string
		call func() error
	}{
		{"AcquireMode Shared (free key)", func() (err error) { s1, err = b.AcquireMode(ctx, req("lock/s", "a", backend.Shared, 3)); return err }},
		{"AcquireMode Shared (1 holder)", func() (err error) { s2, err = b.AcquireMode(ctx, req("lock/s", "b", backend.Shared, 3)); return err }},
		{"AcquireMode Exclusive, fails, registers waiter", func() error {
			r := req("lock/s", "w", backend.Exclusive, 0)
			r.WaitID = "w1"
			_, err := b.AcquireMode(ctx, r)
			return held(err)
		}},
		{"AcquireMode Shared, fails (writer waiting)", func() error {
			_, err := b.AcquireMode(ctx, req("lock/s", "c", backend.Shared, 3))
			return held(err)
		}},
		{"CancelWait", func() error { return b.CancelWait(ctx, "lock/s", "w1") }},
		{"Renew entry", func() error { return b.Renew(ctx, s1) }},
		{"SetMetadata entry", func() error { return b.SetMetadata(ctx, s1, map[string]string{"b": "2"}) }},
		{"Holders (2)", func() error { _, err := b.Holders(ctx, "lock/s"); return err }},
		{"Get (entries)", func() error { _, err := b.Get(ctx, "lock/s"); return err }},
		{"plain Acquire, fails on entries", func() error {
			_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "lock/s", HolderID: "p", TTL: time.Minute})
			return held(err)
		}},
		{"Release entry (1 left)", func() error { return b.Release(ctx, s2) }},
		{"Release entry (last)", func() error { return b.Release(ctx, s1) }},
		{"AcquireMode Exclusive (free key)", func() (err error) { x, err = b.AcquireMode(ctx, req("lock/x", "a", backend.Exclusive, 0)); return err }},
		{"Release Exclusive entry", func() error { return b.Release(ctx, x) }},
		{"AcquireMode Exclusive, 2 ancestors", func() (err error) {
			page, err = b.AcquireMode(ctx, req("lock/f/set/p1", "a", backend.Exclusive, 0, "lock/f", "lock/f/set"))
			return err
		}},
		{"Renew entry, 2 ancestors", func() error { return b.Renew(ctx, page) }},
		{"AcquireMode Exclusive ancestor, fails on intent", func() error {
			_, err := b.AcquireMode(ctx, req("lock/f/set", "b", backend.Exclusive, 0, "lock/f"))
			return held(err)
		}},
		{"AcquireMode Exclusive ancestor, fails, registers", func() error {
			r := req("lock/f/set", "b", backend.Exclusive, 0, "lock/f")
			r.WaitID = "fw"
			_, err := b.AcquireMode(ctx, r)
			return held(err)
		}},
		{"AcquireMode page, fails (Exclusive waiter above)", func() error {
			_, err := b.AcquireMode(ctx, req("lock/f/set/p2", "c", backend.Exclusive, 0, "lock/f", "lock/f/set"))
			return held(err)
		}},
		{"CancelWait ancestor", func() error { return b.CancelWait(ctx, "lock/f/set", "fw") }},
		{"Release entry, 2 ancestors", func() error { return b.Release(ctx, page) }},
		{"AcquireMode Shared Fair (free key), then Release", func() error {
			r := req("lock/q", "a", backend.Shared, 0)
			r.Fair, r.WaitID = true, "q1"
			l, err := b.AcquireMode(ctx, r)
			if err == nil {
				err = b.Release(ctx, l)
			}
			return err
		}},
	}
	calls := func() map[string]int {
		info := admin.Info(ctx, "commandstats").Val()
		m := map[string]int{}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
			if !ok || strings.HasPrefix(line, "#") {
				continue
			}
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			m[name] = n
		}
		return m
	}
	for round := range 2 { // round 0 loads the scripts (NOSCRIPT, then EVAL)
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			before := calls()
			hook.n.Store(0)
			if err := op.call(); err != nil {
				t.Fatalf("round %d, %s: %v", round, op.name, err)
			}
			if round == 0 {
				continue
			}
			want := int64(1)
			if strings.HasSuffix(op.name, "then Release") {
				want = 2
			}
			if got := hook.n.Load(); got != want {
				t.Errorf("%s: got %d round trips, want %d", op.name, got, want)
			}
			after := calls()
			var used []string
			total := 0
			for name, n := range after {
				if d := n - before[name]; d > 0 && name != "evalsha" && name != "info" {
					used = append(used, fmt.Sprintf("%s %d", strings.ToUpper(name), d))
					total += d
				}
			}
			sort.Strings(used)
			t.Logf("%-50s %2d commands: %s", op.name, total, strings.Join(used, ", "))
		}
	}
}

// TestModesWaiterExpires: a fair waiter that dies (never retries, never
// cancels) blocks the waiters behind it only until its own TTL ends, by
// the server's clock; then the queue is pruned and, once empty, its hash is
// gone.
func TestModesWaiterExpires(t *testing.T) {
	mr := miniredis.RunT(t)
	now := time.Now()
	mr.SetTime(now)
	advance := func(d time.Duration) {
		now = now.Add(d)
		mr.SetTime(now)
		mr.FastForward(d)
	}
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, &redisbackend.Options{Prefix: "we:"})
	ctx := ctxBound(t)
	fair := func(id string, ttl time.Duration) backend.ModeRequest {
		return backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "lock/q", HolderID: id, TTL: ttl},
			Fair: true, WaitID: "wait-" + id}
	}
	holder, err := b.AcquireMode(ctx, fair("holder", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []backend.ModeRequest{fair("dies", time.Second), fair("lives", time.Minute)} {
		if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("AcquireMode by %s: got %v, want ErrHeld", r.HolderID, err)
		}
	}
	if err := b.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	var held *backend.HeldError
	if _, err := b.AcquireMode(ctx, fair("lives", time.Minute)); !errors.As(err, &held) || held.Waiting != 1 {
		t.Fatalf("AcquireMode behind a live waiter: got %v, want ErrHeld with Waiting 1", err)
	}
	advance(time.Second)
	l, err := b.AcquireMode(ctx, fair("lives", time.Minute))
	if err != nil {
		t.Fatalf("AcquireMode after the waiter ahead expired: got %v, want nil", err)
	}
	if mr.Exists("we:{lock/q}{}:waiters") {
		t.Errorf("waiters hash after the last waiter got in: got %v, want it gone", mr.Keys())
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestModesDeadEntries: an entry is dead at its own expiry by the server's
// clock even while its hash still exists (the hash expires at its latest
// entry's expiry, and Redis may notice that a moment later): a plain
// Acquire and AcquireMode then take the key, Get and Holders report it
// free, and Renew and Release report the lease lost.
func TestModesDeadEntries(t *testing.T) {
	mr := miniredis.RunT(t)
	now := time.Now()
	mr.SetTime(now)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, &redisbackend.Options{Prefix: "de:"})
	ctx := ctxBound(t)
	for _, plain := range []bool{true, false} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			key := fmt.Sprintf("lock/dead-%v", plain)
			l, err := b.AcquireMode(ctx, backend.ModeRequest{
				AcquireRequest: backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Second}, Mode: backend.Shared})
			if err != nil {
				t.Fatal(err)
			}
			// The server's clock passes the entry's expiry; its hash stays.
			now = now.Add(time.Second)
			mr.SetTime(now)
			name := "de:{" + key + "}{}"
			if !mr.Exists(name) {
				t.Fatalf("%s gone; the test needs it to outlive the entry", name)
			}
			if _, err := b.Get(ctx, key); !errors.Is(err, backend.ErrNotHeld) {
				t.Errorf("Get: got %v, want ErrNotHeld", err)
			}
			if recs, err := b.Holders(ctx, key); err != nil || len(recs) != 0 {
				t.Errorf("Holders: got %v, %v; want none", recs, err)
			}
			if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("Renew: got %v, want ErrLeaseLost", err)
			}
			if err := b.Release(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("Release: got %v, want ErrLeaseLost", err)
			}
			var l2 backend.Lease
			if plain {
				l2, err = b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: time.Minute})
			} else {
				l2, err = b.AcquireMode(ctx, backend.ModeRequest{
					AcquireRequest: backend.AcquireRequest{Key: key, HolderID: "b", TTL: time.Minute}})
			}
			if err != nil {
				t.Fatalf("acquisition of a key whose only entry is dead: got %v, want nil", err)
			}
			if l2.Term <= l.Term {
				t.Errorf("term: got %d, want > %d", l2.Term, l.Term)
			}
			if f, _ := mr.HKeys(name); slices.Contains(f, "h:"+l.Token) {
				t.Errorf("fields of %s: got %q, want the dead entry gone", name, f)
			}
			if err := b.Release(ctx, l2); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestModesIntentGone: an entry whose intent on an ancestor is gone (the
// data was tampered with) is lost: Renew reports ErrLeaseLost and extends
// nothing, since the lock no longer keeps an Exclusive lock above out.
func TestModesIntentGone(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "ig:"})
	l, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/r/a/b", HolderID: "a", TTL: 10 * time.Second},
		Ancestors:      []string{"lock/r", "lock/r/a"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HDel(ctx, "ig:{lock/r}{/a}", "i:"+l.Token).Err(); err != nil {
		t.Fatal(err)
	}
	before := c.PTTL(ctx, "ig:{lock/r}{/a/b}").Val()
	l.TTL = time.Minute
	if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("Renew without an intent: got %v, want ErrLeaseLost", err)
	}
	if after := c.PTTL(ctx, "ig:{lock/r}{/a/b}").Val(); after > before {
		t.Errorf("PTTL of the lock after the failed Renew: got %v, want at most %v (not extended)", after, before)
	}
	// Release still cleans up what is left, the root's intent included.
	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if keys := c.Keys(ctx, "ig:*").Val(); !slices.Equal(keys, []string{"ig:{lock/r}{/a/b}:term"}) {
		t.Errorf("keys after Release: got %q, want the term counter only", keys)
	}
}

// TestModesWrongType: foreign data at a path of backend.Modes (a waiters
// hash, an ancestor's lease hash, a malformed entry) fails the operations
// that touch it with ErrWrongType and is left as it was.
func TestModesWrongType(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "mw:"})
	req := backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/w/x", HolderID: "a", TTL: time.Minute},
		Ancestors:      []string{"lock/w"}, WaitID: "wid",
	}
	tests := []struct {
		name, path string
		put        func(k string) error
		call       func() error
	}{
		{"string at the waiters hash", "mw:{lock/w}{/x}:waiters",
			func(k string) error { return c.Set(ctx, k, "user", 0).Err() },
			func() error { _, err := b.AcquireMode(ctx, req); return err }},
		{"string at the waiters hash, CancelWait", "mw:{lock/w}{/x}:waiters",
			func(k string) error { return c.Set(ctx, k, "user", 0).Err() },
			func() error { return b.CancelWait(ctx, "lock/w/x", "wid") }},
		{"list at an ancestor", "mw:{lock/w}{}",
			func(k string) error { return c.RPush(ctx, k, "user").Err() },
			func() error { _, err := b.AcquireMode(ctx, req); return err }},
		{"malformed entry", "mw:{lock/w}{/x}",
			func(k string) error { return c.HSet(ctx, k, "modes", "1", "h:tok", "garbage").Err() },
			func() error { _, err := b.Holders(ctx, "lock/w/x"); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := tt.put(tt.path); err != nil {
				t.Fatal(err)
			}
			dump := c.Dump(ctx, tt.path).Val()
			err := tt.call()
			if !errors.Is(err, redisbackend.ErrWrongType) || !strings.Contains(err.Error(), tt.path) {
				t.Fatalf("got %v, want ErrWrongType naming %s", err, tt.path)
			}
			if got := c.Dump(ctx, tt.path).Val(); got != dump {
				t.Errorf("%s changed", tt.path)
			}
			if n := c.DBSize(ctx).Val(); n != 1 {
				t.Errorf("DBSIZE: got %d, want 1 (nothing written)", n)
			}
		})
	}
}

// TestModesWaitReplicas: AcquireMode with WaitReplicas and no replica
// fails with ErrNotReplicated and releases the entry and its intents.
func TestModesWaitReplicas(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "mwr:", WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	_, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/r/a", HolderID: "a", TTL: time.Minute},
		Mode:           backend.Shared, Ancestors: []string{"lock/r"},
	})
	if !errors.Is(err, redisbackend.ErrNotReplicated) || !strings.Contains(err.Error(), "released") {
		t.Fatalf("AcquireMode: got %v, want ErrNotReplicated, released", err)
	}
	if keys := c.Keys(ctx, "mwr:*").Val(); !slices.Equal(keys, []string{"mwr:{lock/r}{/a}:term"}) {
		t.Errorf("keys after the failed AcquireMode: got %q, want the term counter only", keys)
	}
	// Renew of an entry acquired without WAIT fails the same way.
	plain := newBackend(t, c, &redisbackend.Options{Prefix: "mwr:"})
	l, err := plain.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/r/a", HolderID: "a", TTL: time.Minute},
		Mode:           backend.Shared, Ancestors: []string{"lock/r"},
	})
	if err != nil {
		t.Fatalf("AcquireMode without WAIT: %v", err)
	}
	if err := b.Renew(ctx, l); !errors.Is(err, redisbackend.ErrNotReplicated) {
		t.Errorf("Renew of the entry: got %v, want an error wrapping ErrNotReplicated", err)
	}
}

// TestModesListTrees: List matches lock keys of a tree literally, within
// and across roots (glob characters in a root or below it included), lists
// one record per holder and never an intent or a waiter.
func TestModesListTrees(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "lt*:"})
	take := func(key string, m backend.Mode, anc ...string) {
		t.Helper()
		if _, err := b.AcquireMode(ctx, backend.ModeRequest{
			AcquireRequest: backend.AcquireRequest{Key: key, HolderID: "h", TTL: time.Minute},
			Mode:           m, Ancestors: anc}); err != nil {
			t.Fatalf("AcquireMode %q: %v", key, err)
		}
	}
	take("lock/t1/a/b", backend.Shared, "lock/t1", "lock/t1/a") // intents on lock/t1 and lock/t1/a
	take("lock/t1/a/b", backend.Shared, "lock/t1", "lock/t1/a") // a second holder
	take("lock/t1/ab", backend.Exclusive)
	take("lock/t1x/a", backend.Exclusive)
	take("lock/t*/a?", backend.Exclusive)
	take("lock/t*", backend.Exclusive)
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "lock/t1/c", HolderID: "plain", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AcquireMode(ctx, backend.ModeRequest{ // a waiter, not listed
		AcquireRequest: backend.AcquireRequest{Key: "lock/t1/ab", HolderID: "w", TTL: time.Minute}, WaitID: "w"}); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	tests := []struct {
		prefix string
		want   []string
	}{
		{"lock/t1/a", []string{"lock/t1/a/b", "lock/t1/a/b", "lock/t1/ab"}},
		{"lock/t1/a/", []string{"lock/t1/a/b", "lock/t1/a/b"}},
		{"lock/t1/", []string{"lock/t1/a/b", "lock/t1/a/b", "lock/t1/ab", "lock/t1/c"}},
		{"lock/t1", []string{"lock/t1/a/b", "lock/t1/a/b", "lock/t1/ab", "lock/t1/c", "lock/t1x/a"}},
		{"lock/t*", []string{"lock/t*", "lock/t*/a?"}},
		{"lock/t*/a", []string{"lock/t*/a?"}},
		{"lo", []string{"lock/t*", "lock/t*/a?", "lock/t1/a/b", "lock/t1/a/b", "lock/t1/ab", "lock/t1/c", "lock/t1x/a"}},
	}
	for _, tt := range tests {
		recs, err := b.List(ctx, tt.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tt.prefix, err)
		}
		if got := listedKeys(recs); !slices.Equal(got, tt.want) {
			t.Errorf("List(%q): got %q, want %q", tt.prefix, got, tt.want)
		}
	}
}

// TestModesEntryEncoding: an entry keeps holder IDs and metadata of any
// bytes exactly (empty strings, colons and digits that look like the
// encoding's lengths, NUL and bytes that are not UTF-8), through
// AcquireMode, Holders, Get, List, SetMetadata and a HeldError.
func TestModesEntryEncoding(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "me:"})
	md := map[string]string{
		"":          "empty name",
		"empty":     "",
		"3:abc":     "12:x:y",
		"nul\x00":   "\x00\xff\xfe",
		"unicode":   "ünï ✓",
		"0":         "0:",
		"long":      strings.Repeat("9:", 5000),
		"newline\n": "a\nb",
	}
	holder := "10:holder:with:colons\x00"
	l, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/enc/a", HolderID: holder, TTL: time.Minute, Metadata: md},
		Mode:           backend.Shared, Limit: 1, Ancestors: []string{"lock/enc"},
	})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, r backend.Record, want map[string]string) {
		t.Helper()
		if r.HolderID != holder || r.Token != l.Token || r.Term != l.Term || r.Mode != backend.Shared || r.Limit != 1 {
			t.Errorf("%s: got %q token %s term %d %v limit %d, want %q token %s term %d shared limit 1",
				what, r.HolderID, r.Token, r.Term, r.Mode, r.Limit, holder, l.Token, l.Term)
		}
		if !maps.Equal(r.Metadata, want) {
			t.Errorf("%s metadata: got %q, want %q", what, r.Metadata, want)
		}
	}
	recs, err := b.Holders(ctx, "lock/enc/a")
	if err != nil || len(recs) != 1 {
		t.Fatalf("Holders: got %v, %v; want one record", recs, err)
	}
	check("Holders", recs[0], md)
	r, err := b.Get(ctx, "lock/enc/a")
	if err != nil {
		t.Fatal(err)
	}
	check("Get", r, md)
	recs, err = b.List(ctx, "lock/enc")
	if err != nil || len(recs) != 1 {
		t.Fatalf("List: got %v, %v; want one record (intents are not listed)", recs, err)
	}
	check("List", recs[0], md)
	// A HeldError names the lock below from the root's intent.
	_, err = b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "lock/enc", HolderID: "x", TTL: time.Minute}})
	var held *backend.HeldError
	if !errors.As(err, &held) || len(held.Holders) != 1 {
		t.Fatalf("AcquireMode of the root: got %v, want ErrHeld with one holder", err)
	}
	if held.Holder.Key != "lock/enc/a" {
		t.Errorf("HeldError.Holder.Key: got %q, want the lock below", held.Holder.Key)
	}
	check("HeldError", held.Holder, md)
	md2 := map[string]string{"1:": "2:", "": ""}
	if err := b.SetMetadata(ctx, l, md2); err != nil {
		t.Fatal(err)
	}
	recs, err = b.Holders(ctx, "lock/enc/a")
	if err != nil || len(recs) != 1 {
		t.Fatalf("Holders: got %v, %v; want one record", recs, err)
	}
	check("Holders after SetMetadata", recs[0], md2)
	if err := b.Renew(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}
