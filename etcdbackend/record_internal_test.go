package etcdbackend

import (
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

// TestAppendRecord: the hand-written encoding of a record without
// metadata is what encoding/json writes, and a record with more goes
// through encoding/json; either decodes back to what was encoded.
func TestAppendRecord(t *testing.T) {
	now := time.Now()
	cases := map[string]recordBody{
		"local time":       {AcquiredAt: now},
		"UTC":              {AcquiredAt: now.UTC()},
		"fixed zone":       {AcquiredAt: now.In(time.FixedZone("x", -(3*3600 + 1800)))},
		"whole second":     {AcquiredAt: time.Date(2026, 11, 23, 5, 0, 0, 0, time.UTC)},
		"zero time":        {},
		"year 10000":       {AcquiredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"metadata":         {AcquiredAt: now, Metadata: map[string]string{"user": "alice@example.com", "op": "tally \"x\"\n"}},
		"empty metadata":   {AcquiredAt: now, Metadata: map[string]string{}},
		"mode and limit":   {AcquiredAt: now, Mode: backend.Shared, Limit: 3},
		"intent":           {AcquiredAt: now, Mode: backend.Exclusive, Key: "a/b"},
		"escaped holder ✓": {AcquiredAt: now},
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			token, holder := newSessionToken(0x1234, now), "holder \"q\" "+name
			got, err := appendRecord([]byte("keep"), token, holder, body)
			js, jerr := json.Marshal(body)
			if jerr != nil {
				if err == nil {
					t.Fatalf("appendRecord: got no error, want encoding/json's %v", jerr)
				}
				return
			}
			if err != nil {
				t.Fatalf("appendRecord: %v", err)
			}
			if want := "keep" + recordHeader(token, holder) + string(js); string(got) != want {
				t.Fatalf("appendRecord:\n got %q\nwant %q", got, want)
			}
			gotToken, gotHolder, gotBody, err := decodeRecord(got[len("keep"):])
			if err != nil {
				t.Fatalf("decodeRecord: %v", err)
			}
			if gotToken != token || gotHolder != holder || !gotBody.AcquiredAt.Equal(body.AcquiredAt) || gotBody.Mode != body.Mode || gotBody.Limit != body.Limit || gotBody.Key != body.Key || len(gotBody.Metadata) != len(body.Metadata) {
				t.Fatalf("decodeRecord: got %q, %q, %+v; want %q, %q, %+v", gotToken, gotHolder, gotBody, token, holder, body)
			}
		})
	}
}

// TestTokens: a token holds its etcd lease ID and acquisition time where
// parseToken and parseTokenTime read them, a session's is marked as one,
// and their random parts differ.
func TestTokens(t *testing.T) {
	at := time.Unix(0, 1_763_870_000_123_456_789)
	id := clientv3.LeaseID(0x694d9a0b1c2d3e4f)
	seen := make(map[string]bool)
	for _, session := range []bool{false, true} {
		for range 100 {
			tok := newToken(id, at)
			if session {
				tok = newSessionToken(id, at)
			}
			if seen[tok] {
				t.Fatalf("token %q made twice", tok)
			}
			seen[tok] = true
			wantLen := 16 + 1 + 16 + 1 + 32
			if session {
				wantLen++
			}
			if len(tok) != wantLen {
				t.Fatalf("token %q: got length %d, want %d", tok, len(tok), wantLen)
			}
			if got, ok := parseToken(tok); !ok || got != id {
				t.Fatalf("parseToken(%q): got %x, %v; want %x, true", tok, got, ok, id)
			}
			if got, ok := parseTokenTime(tok); !ok || !got.Equal(at) {
				t.Fatalf("parseTokenTime(%q): got %v, %v; want %v, true", tok, got, ok, at)
			}
			if onSession(tok) != session {
				t.Fatalf("onSession(%q): got %v, want %v", tok, !session, session)
			}
		}
	}
}

// TestTokenCheck: Release's and Renew's owner check on a session compares
// the record's value with its header and the header's upper bound.
func TestTokenCheck(t *testing.T) {
	b := &Backend{prefix: "p/"}
	l := backend.Lease{Key: "a/b:c", HolderID: "h \"1\"\tü", Token: newSessionToken(7, time.Now())}
	cmps := b.tokenCheck(l)
	h := recordHeader(l.Token, l.HolderID)
	want := []struct{ key, value string }{{"p/a/b:c", h}, {"p/a/b:c", h[:len(h)-1] + "\x0b"}}
	if len(cmps) != len(want) {
		t.Fatalf("got %d comparisons, want %d", len(cmps), len(want))
	}
	for i, c := range cmps {
		if string(c.Key) != want[i].key || string(c.GetValue()) != want[i].value {
			t.Errorf("comparison %d: got %q %v %q, want %q %q", i, c.Key, c.Result, c.GetValue(), want[i].key, want[i].value)
		}
	}
}

// TestTokenAndRecordAllocations: a session token costs at most two
// allocations (its buffer, sized for it, and the string), and the record
// of a plain acquisition one, not one per growth of a buffer that started
// empty. (testing.AllocsPerRun counts the process's, the embedded etcd
// server's and the goroutines of earlier tests still ending included: the
// least of five measures is the function's own.)
func TestTokenAndRecordAllocations(t *testing.T) {
	at := time.Now()
	var token string
	if n := minAllocs(func() { token = newSessionToken(1, at) }); n > 2 {
		t.Errorf("newSessionToken: %v allocations, want at most 2", n)
	}
	if len(token) != tokenLen {
		t.Errorf("token %q: %d bytes, want tokenLen %d", token, len(token), tokenLen)
	}
	if n := minAllocs(func() {
		_, _ = appendRecord(nil, token, "holder-with-a-name", recordBody{AcquiredAt: at})
	}); n > 1 {
		t.Errorf("appendRecord: %v allocations, want 1", n)
	}
}

// minAllocs is the least of five testing.AllocsPerRun(1000, f).
func minAllocs(f func()) float64 {
	n := testing.AllocsPerRun(1000, f)
	for range 4 {
		n = min(n, testing.AllocsPerRun(1000, f))
	}
	return n
}
