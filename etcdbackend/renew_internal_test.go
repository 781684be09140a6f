package etcdbackend

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

// checkBackend returns a Backend with nothing but the state checkSession
// reads: its prefix, what it holds and what it is acquiring.
func checkBackend() *Backend {
	return &Backend{prefix: "p/", owned: make(map[clientv3.LeaseID]map[string]string), pending: make(map[string]int)}
}

// TestCheckSession: RenewBatch's owner check from a look-up renews a lease
// whose key is attached and held here with its token, loses (and forgets)
// one whose key is not attached or is held with another token, and
// returns as orphans the attached keys held by nobody here, but neither a
// key being acquired (or an entry of it), a heartbeat record, nor the lease
// mark.
func TestCheckSession(t *testing.T) {
	const id = clientv3.LeaseID(7)
	b := checkBackend()
	for _, k := range []string{"held", "gone", "stale"} {
		b.own(id, k, "t-"+k)
	}
	b.setPending("coming", 1)
	attached := [][]byte{
		[]byte("p/held"), []byte("p/stale"), []byte("p/orphan"), []byte("p/coming"),
		[]byte("p/coming\x00hx/w"), []byte("p/e/heartbeat/a"), []byte("p/\x00lease/7"),
		[]byte("other/held"),
	}
	leases := []backend.Lease{
		{Key: "held", Token: "t-held", Term: 1},
		{Key: "gone", Token: "t-gone", Term: 2},     // not attached
		{Key: "stale", Token: "t-old", Term: 3},     // attached, another token
		{Key: "orphan", Token: "t-orphan", Term: 4}, // attached, not held here
	}
	errs := make([]error, len(leases))
	orphans := b.checkSession(id, leases, []int{0, 1, 2, 3}, errs, attached)
	if errs[0] != nil {
		t.Errorf("held: got %v, want nil", errs[0])
	}
	for i := 1; i < len(leases); i++ {
		if !errors.Is(errs[i], backend.ErrLeaseLost) {
			t.Errorf("%s: got %v, want ErrLeaseLost", leases[i].Key, errs[i])
		}
	}
	if owned, _ := b.owns(id, "gone", "t-gone"); owned {
		t.Errorf("gone: still recorded as held after it was found lost")
	}
	if owned, _ := b.owns(id, "stale", "t-stale"); !owned {
		t.Errorf("stale: the record of the current token was forgotten by the loss of an older one")
	}
	if want := []string{"p/orphan"}; !slices.Equal(orphans, want) {
		t.Errorf("orphans: got %q, want %q", orphans, want)
	}
}

// TestRenewPassAllocations: the owner check of a session and the look-up
// of the heartbeats riding on it make no allocation per key (issue #13: a
// string of each key, a map rebuilt per pass). testing.AllocsPerRun counts
// the whole process's, the embedded etcd server's included, so the test
// compares a pass over 16,384 keys with one over 1,024: one allocation per
// key would add 15,360.
func TestRenewPassAllocations(t *testing.T) {
	small, large := renewPassAllocs(t, 1024), renewPassAllocs(t, 16384)
	t.Logf("allocations per pass: %v over 1,024 keys, %v over 16,384", small, large)
	if large-small > 15360/4 {
		t.Errorf("a pass over 16,384 keys makes %v allocations more than one over 1,024, want under %d (none per key)", large-small, 15360/4)
	}
}

// renewPassAllocs returns the allocations of checkSession and hostLookedUp
// over a session of n keys held here, each with a heartbeat record riding
// on the session.
func renewPassAllocs(t *testing.T, n int) float64 {
	const id = clientv3.LeaseID(7)
	b := checkBackend()
	leases := make([]backend.Lease, n)
	attached := make([][]byte, 0, 2*n)
	items := make([]int, n)
	beats := &hbSession{secs: 10, beats: make(map[string]*hbBeat), hosts: make(map[clientv3.LeaseID]time.Time), on: id}
	for i := range leases {
		// Longer than 32 bytes, so that a string of one would not fit in
		// the stack buffer of a conversion.
		key := fmt.Sprintf("locks/some/rather/long/name/%06d", i)
		leases[i] = backend.Lease{Key: key, Token: fmt.Sprintf("token-%d", i), Term: uint64(i + 1)}
		b.own(id, key, leases[i].Token)
		items[i] = i
		attached = append(attached, []byte(b.prefix+key))
		hb := b.heartbeatKey(key, "instance-with-a-long-name")
		beats.beats[hb] = &hbBeat{}
		attached = append(attached, []byte(hb))
	}
	b.hbSessions = map[int64]*hbSession{10: beats}
	errs := make([]error, n)
	allocs := testing.AllocsPerRun(5, func() {
		if orphans := b.checkSession(id, leases, items, errs, attached); len(orphans) != 0 {
			t.Fatalf("orphans: %d, want none", len(orphans))
		}
		b.hostLookedUp(id, attached, false)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("check: %v", err)
	}
	for k, beat := range beats.beats {
		if !beat.written {
			t.Fatalf("heartbeat %q: not marked as on the lease after a look-up that found it", k)
		}
	}
	return allocs
}

// TestLookCouldSee: the changes a renewal's look-up could find differently
// from what the Backend knows, and only those, call for the next look-up
// (coveredRenewal): a deletion of a key held here, a put of a key not held
// here on a session lease this Backend holds keys on (an orphan), a put of
// a key held here on another lease, and any change of a heartbeat record;
// not a put of a held key on its own lease, a change of another Backend's
// keys on leases of its own, or the lease mark.
func TestLookCouldSee(t *testing.T) {
	const id, other = clientv3.LeaseID(7), clientv3.LeaseID(9)
	b := checkBackend()
	b.own(id, "held", "t")
	b.own(id, "e\x00h", "t") // an entry of backend.Modes
	put := func(k string, lease clientv3.LeaseID) *clientv3.Event {
		return &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(k), Lease: int64(lease)}}
	}
	del := func(k string) *clientv3.Event {
		return &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(k)}}
	}
	for _, c := range []struct {
		what string
		ev   *clientv3.Event
		want bool
	}{
		{"deletion of a held key", del("p/held"), true},
		{"deletion of a held entry", del("p/e\x00h"), true},
		{"deletion of another key", del("p/free"), false},
		{"put of a held key on its lease", put("p/held", id), false},
		{"put of a held key on another lease", put("p/held", other), true},
		{"put of another key on a held session", put("p/orphan", id), true},
		{"put of another key on another lease", put("p/theirs", other), false},
		{"put of a heartbeat record", put("p/e/heartbeat/a", other), true},
		{"deletion of a heartbeat record", del("p/e/heartbeat/a"), true},
		{"put of the lease mark", put("p/\x00lease/7", id), false},
		{"put outside the prefix", put("q/orphan", id), false},
	} {
		b.mu.Lock()
		got := b.lookCouldSee(c.ev)
		b.mu.Unlock()
		if got != c.want {
			t.Errorf("%s: got %v, want %v", c.what, got, c.want)
		}
	}
}

// TestForgetLookMark: once this Backend holds nothing on a session lease,
// its look-up mark is forgotten (a key put on that lease meanwhile is not
// counted by noteEvents), so the first renewal after it holds a key there
// again looks up; likewise when the lease is forgotten.
func TestForgetLookMark(t *testing.T) {
	const id = clientv3.LeaseID(7)
	b := checkBackend()
	b.looked = make(map[clientv3.LeaseID]lookMark)
	b.own(id, "a", "t")
	b.own(id, "b", "t")
	b.lookedUp(id, lookMark{cover: 1})
	b.disown(id, "a", "t")
	if _, ok := b.looked[id]; !ok {
		t.Fatal("mark forgotten while a key is still held")
	}
	b.disown(id, "b", "t")
	if _, ok := b.looked[id]; ok {
		t.Error("mark kept after the last key was disowned")
	}
	b.own(id, "a", "t")
	b.lookedUp(id, lookMark{cover: 1})
	b.forgetLease(id)
	if _, ok := b.looked[id]; ok {
		t.Error("mark kept after the lease was forgotten")
	}
	b.lookedUp(id, lookMark{cover: 1})
	if _, ok := b.looked[id]; ok {
		t.Error("mark recorded for a lease with no key held")
	}
	b.own(id, "a", "t")
	b.lookedUp(id, lookMark{})
	if _, ok := b.looked[id]; ok {
		t.Error("mark recorded for a look-up the watch did not follow")
	}
}

// TestNoteEventsBeforeFirstMark: a change delivered while the first look-up
// of a session is in flight (no mark recorded yet) is counted, so the mark
// that look-up records, read before it was sent, does not match and the
// next renewal looks up again; with no key held on a session, nothing is
// counted.
func TestNoteEventsBeforeFirstMark(t *testing.T) {
	const id = clientv3.LeaseID(7)
	b := checkBackend()
	b.looked = make(map[clientv3.LeaseID]lookMark)
	del := []*clientv3.Event{{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte("p/held")}}}
	b.noteEvents(del)
	if b.lookChanges != 0 {
		t.Errorf("nothing held: %d changes counted, want 0", b.lookChanges)
	}
	b.own(id, "held", "t")
	mark := lookMark{cover: 1, changes: b.lookChanges} // read before the look-up is sent
	b.noteEvents(del)                                  // delivered while it is in flight
	b.lookedUp(id, mark)
	b.mu.Lock()
	stale := b.looked[id] != lookMark{cover: 1, changes: b.lookChanges}
	b.mu.Unlock()
	if !stale {
		t.Error("a deletion delivered during the first look-up left its mark current: the next renewal would skip the look-up")
	}
}

// TestHostLookupRecordedDuringBatch: a renewal's look-up of a session's
// keys is recorded for the heartbeat records while a heartbeat batch of
// their TTL is under way (it holds the heartbeat session's mu), so that the
// next batch still finds the session a host for them. With renewals and
// batches on the same grid (the elector's defaults, both every TTL/2) the
// look-up always came during a batch and was dropped, and 10,000
// elections sent 10 requests a second moving records off the session and
// back instead of 2 (bench, -only many -many etcd:10000).
func TestHostLookupRecordedDuringBatch(t *testing.T) {
	const id = clientv3.LeaseID(7)
	b := checkBackend()
	b.own(id, "election", "token")
	beats := &hbSession{secs: 10, beats: make(map[string]*hbBeat), hosts: make(map[clientv3.LeaseID]time.Time), on: id}
	b.hbSessions = map[int64]*hbSession{10: beats}
	beats.mu.Lock() // a batch under way
	b.hostLookedUp(id, nil, true)
	beats.mu.Unlock()
	beats.hostsMu.Lock()
	_, ok := beats.hosts[id]
	beats.hostsMu.Unlock()
	if !ok {
		t.Fatal("the look-up made during a heartbeat batch was not recorded")
	}
}
