package redisbackend_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
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

// TestValidateKey: empty keys and keys with a brace are refused by
// ValidateKey and by every method, without a command reaching the server;
// keys with '/', ':' and glob characters are fine.
func TestValidateKey(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	hook := &countHook{}
	c.AddHook(hook)
	b := newBackend(t, c, nil)
	ctx := ctxBound(t)

	for _, key := range []string{"billing", "lock/a:b", "lock/*?[x]\\", "a%b", "ünï"} {
		if err := b.ValidateKey(key); err != nil {
			t.Errorf("ValidateKey(%q): got %v, want nil", key, err)
		}
	}
	tests := []struct {
		key, reason string
	}{
		{"", "empty key"},
		{"a{b", `contains '{'`},
		{"a}b", `contains '}'`},
		{"{tag}", `contains '{'`},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.key), func(t *testing.T) {
			err := b.ValidateKey(tt.key)
			if !errors.Is(err, backend.ErrInvalid) {
				t.Fatalf("ValidateKey: got %v, want an error wrapping backend.ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.reason) || (tt.key != "" && !strings.Contains(err.Error(), strconv.Quote(tt.key))) {
				t.Errorf("ValidateKey: got message %q, want it to name the key and say %q", err, tt.reason)
			}
			lease := backend.Lease{Key: tt.key, HolderID: "a", Token: "t", Term: 1, TTL: time.Minute}
			calls := map[string]func() error{
				"Acquire": func() error {
					_, err := b.Acquire(ctx, backend.AcquireRequest{Key: tt.key, HolderID: "a", TTL: time.Minute})
					return err
				},
				"Renew":        func() error { return b.Renew(ctx, lease) },
				"Release":      func() error { return b.Release(ctx, lease) },
				"SetMetadata":  func() error { return b.SetMetadata(ctx, lease, nil) },
				"Get":          func() error { _, err := b.Get(ctx, tt.key); return err },
				"Heartbeat":    func() error { return b.Heartbeat(ctx, tt.key, "a", time.Minute) },
				"Members":      func() error { _, err := b.Members(ctx, tt.key); return err },
				"RemoveMember": func() error { return b.RemoveMember(ctx, tt.key, "a") },
				"Watch":        func() error { _, err := b.Watch(ctx, tt.key); return err },
			}
			hook.n.Store(0)
			for name, call := range calls {
				if err := call(); !errors.Is(err, backend.ErrInvalid) {
					t.Errorf("%s: got %v, want an error wrapping backend.ErrInvalid", name, err)
				}
			}
			if n := hook.n.Load(); n != 0 {
				t.Errorf("commands sent for invalid keys: got %d, want 0", n)
			}
		})
	}
	if got := b.MinTTL(); got != 100*time.Millisecond {
		t.Errorf("MinTTL: got %v, want 100ms", got)
	}
}

// listedKeys returns the keys of recs, in order.
func listedKeys(recs []backend.Record) []string {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	return keys
}

// TestList checks what is specific to Redis in List: glob characters in
// either prefix are matched literally, bookkeeping keys and foreign data are
// never listed, many keys span several SCAN batches, and the server sees
// SCAN and never KEYS.
func TestList(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
	admin := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "li*st[1]?:"})
	// Another backend whose prefix the first one's pattern would match if
	// glob characters were not escaped.
	other := newBackend(t, c, &redisbackend.Options{Prefix: "list1x:"})

	acquire := func(b *redisbackend.Backend, key, holder string, md map[string]string) backend.Lease {
		t.Helper()
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: holder, TTL: time.Minute, Metadata: md})
		if err != nil {
			t.Fatalf("Acquire %q: %v", key, err)
		}
		return l
	}
	held := map[string]backend.Lease{}
	for _, key := range []string{"lock/a", "lock/a:b", "lock/*", "lock/?x", "lock/[ab]", `lock/\`, "job"} {
		held[key] = acquire(b, key, "h-"+key, map[string]string{"key": key})
	}
	acquire(other, "lock/a", "other", nil)
	// Bookkeeping and foreign data under the prefix: heartbeats (one whose ID
	// ends with a brace, so its name ends like a lease's), term counters of
	// released leases, members sets, a string at the name an earlier
	// version gave a lock's lease, and foreign data at the paths of an
	// election's and of a lock's lease hash (which the holders script
	// answers with WRONGTYPE: skipped, not an error).
	if err := b.Heartbeat(ctx, "lock/a", "x}", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "lock/gone", "y", time.Minute); err != nil {
		t.Fatal(err)
	}
	gone := acquire(b, "lock/released", "h", nil)
	if err := b.Release(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(ctx, "li*st[1]?:{lock/foreign}", "user data", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(ctx, "li*st[1]?:{foreign}", "user data", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.RPush(ctx, "li*st[1]?:{lock/foreign}{/x}", "user data").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		prefix string
		want   []string
	}{
		{"", []string{"job", "lock/*", "lock/?x", "lock/[ab]", "lock/\\", "lock/a", "lock/a:b"}},
		{"lock/", []string{"lock/*", "lock/?x", "lock/[ab]", "lock/\\", "lock/a", "lock/a:b"}},
		{"lock/a", []string{"lock/a", "lock/a:b"}},
		{"lock/*", []string{"lock/*"}},
		{"lock/?", []string{"lock/?x"}},
		{"lock/[", []string{"lock/[ab]"}},
		{`lock/\`, []string{`lock/\`}},
		{"nothing", nil},
		{"a{b", nil},
	}
	for _, tt := range tests {
		recs, err := b.List(ctx, tt.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tt.prefix, err)
		}
		if got := listedKeys(recs); !slices.Equal(got, tt.want) {
			t.Errorf("List(%q): got keys %q, want %q", tt.prefix, got, tt.want)
		}
		for _, r := range recs {
			l := held[r.Key]
			if r.HolderID != l.HolderID || r.Token != l.Token || r.Term != l.Term || r.Metadata["key"] != r.Key {
				t.Errorf("List(%q) record %q: got holder %q token %q term %d metadata %v, want the lease %+v",
					tt.prefix, r.Key, r.HolderID, r.Token, r.Term, r.Metadata, l)
			}
			if r.TTL <= 0 || r.TTL > time.Minute {
				t.Errorf("List(%q) record %q: TTL %v, want in (0, 1m]", tt.prefix, r.Key, r.TTL)
			}
		}
	}
	stats := admin.Info(ctx, "commandstats").Val()
	if !strings.Contains(stats, "cmdstat_scan:") || strings.Contains(stats, "cmdstat_keys:") {
		t.Errorf("commands List sent: want SCAN and never KEYS, got commandstats:\n%s", stats)
	}

	t.Run("glob characters below a root", func(t *testing.T) {
		// A prefix below a lock root's segment is matched inside the
		// tree's names, escaped there too.
		b := newBackend(t, c, &redisbackend.Options{Prefix: "below:"})
		for _, key := range []string{"lock/t/*", "lock/t/*x", "lock/t/?x", "lock/t/[ab]", `lock/t/\`, `lock/t/\x`, "lock/t/ab"} {
			acquire(b, key, "h", nil)
		}
		for _, tt := range []struct {
			prefix string
			want   []string
		}{
			{"lock/t/*", []string{"lock/t/*", "lock/t/*x"}},
			{"lock/t/?", []string{"lock/t/?x"}},
			{"lock/t/[", []string{"lock/t/[ab]"}},
			{"lock/t/[ab]", []string{"lock/t/[ab]"}},
			{`lock/t/\`, []string{`lock/t/\`, `lock/t/\x`}},
		} {
			recs, err := b.List(ctx, tt.prefix)
			if err != nil {
				t.Fatalf("List(%q): %v", tt.prefix, err)
			}
			if got := listedKeys(recs); !slices.Equal(got, tt.want) {
				t.Errorf("List(%q): got keys %q, want %q", tt.prefix, got, tt.want)
			}
		}
	})

	t.Run("many keys", func(t *testing.T) {
		b := newBackend(t, c, &redisbackend.Options{Prefix: "many:"})
		const n = 1500 // several SCAN batches
		var want []string
		p := c.Pipeline()
		for i := range n {
			key := fmt.Sprintf("k%05d", i)
			want = append(want, key)
			// Written with plain commands, as Acquire would, to be quick.
			p.HSet(ctx, "many:{"+key+"}", "holder", "h", "token", "t"+key, "term", i+1, "acquired_at", 1, "renewed_at", 1, "ttl", 60000)
			p.PExpire(ctx, "many:{"+key+"}", time.Minute)
			p.Set(ctx, "many:{"+key+"}:term", i+1, 0)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		recs, err := b.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := listedKeys(recs); !slices.Equal(got, want) {
			t.Fatalf("List: got %d keys (first %q), want %d sorted keys", len(got), got[:min(3, len(got))], n)
		}
	})
}

// TestSetMetadata checks on a real server that SetMetadata replaces the
// metadata fields, keeps the TTL and the other fields, and is owner-checked.
func TestSetMetadata(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "md:"})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute,
		Metadata: map[string]string{"old": "1", "keep": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	// Shorten the TTL by hand: SetMetadata must leave it as it is.
	if err := c.PExpire(ctx, "md:{k}", 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	before := c.HGetAll(ctx, "md:{k}").Val()
	md := map[string]string{"keep": "y", "new": "2"}
	if err := b.SetMetadata(ctx, l, md); err != nil {
		t.Fatalf("SetMetadata: got %v, want nil", err)
	}
	rec, err := b.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(rec.Metadata, md) {
		t.Errorf("metadata: got %v, want %v", rec.Metadata, md)
	}
	if rec.TTL > 30*time.Second || rec.TTL <= 0 {
		t.Errorf("TTL after SetMetadata: got %v, want at most the 30s left (not extended)", rec.TTL)
	}
	after := c.HGetAll(ctx, "md:{k}").Val()
	for _, f := range []string{"holder", "token", "term", "acquired_at", "renewed_at", "ttl"} {
		if after[f] != before[f] {
			t.Errorf("field %s: got %q, want %q (unchanged)", f, after[f], before[f])
		}
	}
	if err := b.SetMetadata(ctx, l, nil); err != nil {
		t.Fatal(err)
	}
	if rec, _ := b.Get(ctx, "k"); len(rec.Metadata) != 0 {
		t.Errorf("metadata after SetMetadata(nil): got %v, want none", rec.Metadata)
	}

	other := l
	other.Token = "not-the-token"
	if err := b.SetMetadata(ctx, other, md); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("SetMetadata with another token: got %v, want ErrLeaseLost", err)
	}
	if rec, _ := b.Get(ctx, "k"); len(rec.Metadata) != 0 {
		t.Errorf("metadata after a refused SetMetadata: got %v, want none", rec.Metadata)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := b.SetMetadata(ctx, l, md); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("SetMetadata after Release: got %v, want ErrLeaseLost", err)
	}
	if n := c.Exists(ctx, "md:{k}").Val(); n != 0 {
		t.Errorf("EXISTS md:{k} after a SetMetadata on a released lease: got %d, want 0 (nothing written)", n)
	}
}

// TestManyMetadata: metadata larger than what one Lua unpack can pass goes
// through Acquire and SetMetadata intact.
func TestManyMetadata(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "mm:"})
	md := make(map[string]string, 6000)
	for i := range 6000 {
		md[fmt.Sprintf("k%d", i)] = strconv.Itoa(i)
	}
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute, Metadata: md})
	if err != nil {
		t.Fatalf("Acquire with %d metadata entries: %v", len(md), err)
	}
	if rec, err := b.Get(ctx, "k"); err != nil || !maps.Equal(rec.Metadata, md) {
		t.Fatalf("Get: got %d metadata entries (error %v), want %d", len(rec.Metadata), err, len(md))
	}
	md2 := map[string]string{"only": "one"}
	for i := range 5000 {
		md2[fmt.Sprintf("n%d", i)] = "x"
	}
	if err := b.SetMetadata(ctx, l, md2); err != nil {
		t.Fatalf("SetMetadata: %v", err)
	}
	if rec, err := b.Get(ctx, "k"); err != nil || !maps.Equal(rec.Metadata, md2) {
		t.Fatalf("Get after SetMetadata: got %d metadata entries (error %v), want %d", len(rec.Metadata), err, len(md2))
	}
}
