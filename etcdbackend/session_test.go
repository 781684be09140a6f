package etcdbackend_test

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// grantedTTL returns the TTL etcd granted lease id.
func grantedTTL(t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) time.Duration {
	t.Helper()
	resp, err := cli.TimeToLive(testCtx(t), id)
	if err != nil {
		t.Fatalf("TimeToLive(%x): %v", id, err)
	}
	return time.Duration(resp.GrantedTTL) * time.Second
}

// sessionOf returns the etcd lease a key's record is attached to.
func sessionOf(t *testing.T, cli *clientv3.Client, k string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(testCtx(t), k)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("raw Get(%q): got %v, %v; want one record", k, resp, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// TestSession: plain acquisitions of one TTL share one etcd lease, granted
// once for that TTL plus its headroom: an acquisition is one transaction
// (with a keep-alive of the session sent together only when the session's
// last grant or keep-alive was sent more than the headroom before it), a
// release one owner-checked transaction, with no grant and no revocation; a
// Detached acquisition gets a lease of its own, of the TTL asked for.
func TestSession(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	prefix := newPrefix()
	cli := newClient(t, nil, n.configure)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	// Long enough that the headroom (15 s) outlasts any pause of a loaded
	// machine between two steps.
	const ttl = 2 * time.Minute
	headroom := etcdbackend.SessionHeadroom(ttl)
	if headroom != 15*time.Second {
		t.Fatalf("headroom of a %v session: got %v, want 15s", ttl, headroom)
	}
	acquire := func(key string, detached bool, minTTL time.Duration) backend.Lease {
		t.Helper()
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: ttl, Detached: detached})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		maxTTL := ttl + headroom
		if detached {
			maxTTL = ttl
		}
		if l.TTL < minTTL || l.TTL > maxTTL {
			t.Errorf("Acquire(%q): Lease.TTL %v, want between %v and %v", key, l.TTL, minTTL, maxTTL)
		}
		return l
	}
	expect := func(what string, want map[string]int64) {
		t.Helper()
		got := n.byMethod()
		for m, w := range want {
			if got[m] != w {
				t.Errorf("%s: %s requests: got %d, want %d (all: %v)", what, m, got[m], w, got)
			}
		}
		var total int64
		for _, w := range want {
			total += w
		}
		if n.total() != total {
			t.Errorf("%s: got %d requests %v, want %d", what, n.total(), got, total)
		}
		n.reset()
	}

	n.reset()
	l1 := acquire("one", false, ttl+headroom)
	expect("first Acquire (grant of the session, txn putting its lease mark too)", map[string]int64{"LeaseGrant": 1, "Txn": 1})
	if got := grantedTTL(t, cli, sessionOf(t, cli, prefix+"one")); got != ttl+headroom {
		t.Errorf("session lease: etcd granted %v, want %v", got, ttl+headroom)
	}
	n.reset()
	l2 := acquire("two", false, ttl)
	expect("second Acquire within the headroom (txn)", map[string]int64{"Txn": 1})
	if s1, s2 := sessionOf(t, cli, prefix+"one"), sessionOf(t, cli, prefix+"two"); s1 != s2 {
		t.Errorf("two acquisitions of one TTL: etcd leases %x and %x, want one session", s1, s2)
	}
	if l1.Token == l2.Token {
		t.Errorf("two acquisitions on one session share the token %q", l1.Token)
	}
	n.reset()
	// A session last kept alive more than the headroom ago: the
	// acquisition sends a keep-alive with its transaction and gets the
	// session's full TTL.
	etcdbackend.AgeSessions(b, headroom+time.Millisecond)
	l3 := acquire("three", false, ttl+headroom)
	expect("Acquire on a session older than the headroom (txn, keep-alive)", map[string]int64{"Txn": 1, "LeaseKeepAlive": 1})
	l4 := acquire("four", false, ttl)
	expect("Acquire after that keep-alive (txn)", map[string]int64{"Txn": 1})
	if err := b.Renew(ctx, l1); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	expect("Renew (txn and keep-alive, sent together)", map[string]int64{"Txn": 1, "LeaseKeepAlive": 1})
	if err := b.Release(ctx, l1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	expect("first Release (txn: no marker, so no markers' lease)", map[string]int64{"Txn": 1})
	if err := b.Release(ctx, l2); err != nil {
		t.Fatalf("Release: %v", err)
	}
	expect("Release (txn)", map[string]int64{"Txn": 1})
	// The session outlives its keys: the next acquisition grants nothing.
	etcdbackend.AgeSessions(b, headroom+time.Millisecond)
	l5 := acquire("five", false, ttl+headroom)
	expect("Acquire on an idle session (txn, keep-alive)", map[string]int64{"Txn": 1, "LeaseKeepAlive": 1})
	if err := b.Renew(ctx, l1); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of a released lease on a live session: got %v, want ErrLeaseLost", err)
	}
	n.reset()

	d := acquire("detached", true, ttl)
	expect("Detached Acquire (grant, txn)", map[string]int64{"LeaseGrant": 1, "Txn": 1})
	if sessionOf(t, cli, prefix+"detached") == sessionOf(t, cli, prefix+"three") {
		t.Error("a Detached lease is on the session")
	}
	n.reset()
	if err := b.Release(ctx, d); err != nil {
		t.Fatalf("Release: %v", err)
	}
	expect("Detached Release (txn, revocation)", map[string]int64{"Txn": 1, "LeaseRevoke": 1})
	for _, l := range []backend.Lease{l3, l4, l5} {
		if err := b.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// TestPairRequests: on a warm session, an Acquire+Release pair is two
// transactions and nothing else (concurrency.Mutex's TryLock+Unlock is two
// requests too): no keep-alive of the session while it was kept alive
// within its headroom, and no lease for release markers (the release
// writes none). The same holds for an entry of backend.Modes.
func TestPairRequests(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	prefix := newPrefix()
	b := newBackend(t, newClient(t, nil, n.configure), &etcdbackend.Options{Prefix: prefix})
	// The headroom (15 s) outlasts any pause of a loaded machine.
	const ttl = 2 * time.Minute
	pair := func(key string) {
		t.Helper()
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: ttl})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatalf("Release(%q): %v", key, err)
		}
	}
	pair("warm-up") // grants the session (and puts its lease mark)
	const pairs = 20
	n.reset()
	for i := range pairs {
		pair(fmt.Sprintf("k%d", i%4))
	}
	if got, want := n.byMethod(), map[string]int64{"Txn": 2 * pairs}; !maps.Equal(got, want) {
		t.Errorf("%d pairs on a warm session: got requests %v, want %v", pairs, got, want)
	}
	// The release of an entry of backend.Modes on a session writes no
	// marker either: a pair is two transactions, and nothing else.
	pair = func(key string) {
		t.Helper()
		req := modeRequest(key, "a", backend.Exclusive)
		req.TTL = ttl
		l, err := b.AcquireMode(ctx, req)
		if err != nil {
			t.Fatalf("AcquireMode(%q): %v", key, err)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatalf("Release(%q): %v", key, err)
		}
	}
	pair("m")
	n.reset()
	for i := range pairs {
		pair(fmt.Sprintf("m%d", i%4))
	}
	if got, want := n.byMethod(), map[string]int64{"Txn": 2 * pairs}; !maps.Equal(got, want) {
		t.Errorf("%d entry pairs on a warm session: got requests %v, want %v", pairs, got, want)
	}
}

// TestRenewBatch: 500 leases on one session are renewed with two requests
// (a keep-alive of the session, a look-up of its keys), each checked on its
// own: a key deleted by hand, and one taken by another holder after that,
// are lost alone.
func TestRenewBatch(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	prefix := newPrefix()
	cli := newClient(t, nil, n.configure)
	opts := &etcdbackend.Options{Prefix: prefix}
	b := newBackend(t, cli, opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	const count = 500
	leases := make([]backend.Lease, count)
	for i := range leases {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("batch/%d", i), HolderID: "a", TTL: 10 * time.Second})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		leases[i] = l
	}
	check := func(what string, lost map[int]bool) {
		t.Helper()
		n.reset()
		errs := b.RenewBatch(ctx, leases)
		if got := n.total(); got != 2 {
			t.Errorf("%s: RenewBatch of %d leases: got %d requests %v, want 2", what, count, got, n.byMethod())
		}
		if len(errs) != count {
			t.Fatalf("%s: got %d errors, want %d", what, len(errs), count)
		}
		for i, err := range errs {
			switch {
			case lost[i] && !errors.Is(err, backend.ErrLeaseLost):
				t.Errorf("%s: lease %d: got %v, want ErrLeaseLost", what, i, err)
			case !lost[i] && err != nil:
				t.Errorf("%s: lease %d: got %v, want nil", what, i, err)
			}
		}
	}
	check("all held", nil)

	// The keep-alive extended the session, hence every key on it.
	id := sessionOf(t, cli, prefix+"batch/0")
	ttl, err := cli.TimeToLive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL < 9 {
		t.Errorf("session TTL left after RenewBatch: %ds, want 9s or more", ttl.TTL)
	}

	if _, err := cli.Delete(ctx, prefix+"batch/7"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, prefix+"batch/8"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Acquire(ctx, backend.AcquireRequest{Key: "batch/8", HolderID: "a", TTL: 10 * time.Second}); err != nil {
		t.Fatalf("other's Acquire of a deleted key: %v", err)
	}
	lost := map[int]bool{7: true, 8: true}
	check("two keys gone", lost)
	// This Backend acquires key 7 again, on the same session: the old
	// lease of that key stays lost.
	l7, err := b.Acquire(ctx, backend.AcquireRequest{Key: "batch/7", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire again: %v", err)
	}
	if sessionOf(t, cli, prefix+"batch/7") != id {
		t.Fatal("the new acquisition is not on the session")
	}
	check("key 7 acquired again", lost)
	if errs := b.RenewBatch(ctx, []backend.Lease{l7}); errs[0] != nil {
		t.Errorf("RenewBatch of the new lease: %v", errs[0])
	}
	// Renew of one lease agrees.
	if err := b.Renew(ctx, leases[7]); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of the old lease of key 7: got %v, want ErrLeaseLost", err)
	}
	if err := b.Renew(ctx, leases[9]); err != nil {
		t.Errorf("Renew of lease 9: got %v, want nil", err)
	}
}

// TestDetachedExpires: a Detached lease ends at its TTL when nobody renews
// it, while a lease of the same TTL on the session, renewed, lives on.
func TestDetachedExpires(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	w := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	const ttl = 5 * time.Second
	kept, err := b.Acquire(ctx, backend.AcquireRequest{Key: "kept", HolderID: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	events, err := w.Watch(ctx, "detached")
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.Acquire(ctx, backend.AcquireRequest{Key: "detached", HolderID: "a", TTL: ttl, Detached: true})
	if err != nil {
		t.Fatal(err)
	}
	// The acquisition's event; a reset may come first (see below), and then
	// the acquisition's event may still follow it.
	lateChange := false
	switch e := nextEvent(t, events, "acquisition", 10*time.Second); e.Type {
	case backend.EventChanged:
	case backend.EventReset:
		t.Logf("watch reset before the acquisition's event")
		lateChange = true
	default:
		t.Fatalf("got %v, want %v", e.Type, backend.EventChanged)
	}
	start := time.Now()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case e, ok := <-events:
			if ok && e.Type == backend.EventChanged && lateChange {
				lateChange = false // the acquisition's, after a reset
				continue
			}
			if !ok || e.Type == backend.EventReset {
				// The contract allows a reset whenever the connection is
				// re-established (one came within 10 ms of the acquisition
				// once, under -race -count=2 on a loaded machine; cause not
				// found): events may have been missed, so the store says
				// whether the lease is still there. A closed watch is
				// taken up again.
				t.Logf("watch reset (open %v) %v after the acquisition", ok, time.Since(start))
				lateChange = true
				if !ok {
					if events, err = w.Watch(ctx, "detached"); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := w.Get(ctx, "detached"); !errors.Is(err, backend.ErrNotHeld) {
					continue // still held, or unknown: wait on
				}
			} else if e.Type != backend.EventExpired {
				t.Fatalf("got %v, want %v", e.Type, backend.EventExpired)
			}
			t.Logf("the Detached lease expired after %v", time.Since(start))
			if err := b.Renew(ctx, kept); err != nil {
				t.Errorf("Renew of the session's lease: %v", err)
			}
			if err := b.Renew(ctx, d); !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("Renew of the expired Detached lease: got %v, want ErrLeaseLost", err)
			}
			return
		case <-tick.C:
			if errs := b.RenewBatch(ctx, []backend.Lease{kept}); errs[0] != nil {
				t.Fatalf("RenewBatch of the session's lease: %v", errs[0])
			}
			if time.Since(start) > 4*ttl {
				t.Fatalf("the Detached lease is still there %v after its last renewal (TTL %v)", time.Since(start), ttl)
			}
		}
	}
}

// TestSessionLost: when the session's etcd lease is gone (expired while the
// store was unreachable, say; revoked here), every key on it is lost, and
// the next acquisition gets a new session.
func TestSessionLost(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	var n counter
	cli := newClient(t, nil, n.configure)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	var leases []backend.Lease
	for _, k := range []string{"a", "b", "c"} {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: k, HolderID: "a", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	id := sessionOf(t, cli, prefix+"a")
	if _, err := cli.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	for i, err := range b.RenewBatch(ctx, leases) {
		if !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("RenewBatch: lease %d: got %v, want ErrLeaseLost", i, err)
		}
	}
	if err := b.Renew(ctx, leases[0]); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew: got %v, want ErrLeaseLost", err)
	}
	n.reset()
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "a", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire after the session was lost: %v", err)
	}
	// The loss found by the renewals is remembered: the acquisition grants
	// a new session at once, without first trying the lost one.
	if got, want := n.byMethod(), map[string]int64{"LeaseGrant": 1, "Txn": 1}; !maps.Equal(got, want) {
		t.Errorf("requests of the acquisition after the loss: got %v, want %v", got, want)
	}
	if got := sessionOf(t, cli, prefix+"a"); got == id {
		t.Errorf("the new acquisition is on the lost session %x", id)
	}
	if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
		t.Errorf("RenewBatch on the new session: %v", errs[0])
	}

	// Lost without this Backend noticing first: the acquisition's
	// transaction finds the session lease gone, and is retried on a new one.
	id = sessionOf(t, cli, prefix+"a")
	if _, err := cli.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "d", HolderID: "a", TTL: 10 * time.Second}); err != nil {
		t.Fatalf("Acquire on a session revoked unnoticed: %v", err)
	}
	if got := sessionOf(t, cli, prefix+"d"); got == id {
		t.Errorf("the acquisition is on the revoked session %x", id)
	}
}

// BenchmarkIdleRequests100 counts the etcd requests of two instances
// running the same 100 elections, one leading them all, the other
// following, at TTL 2 s (the elector's defaults otherwise: renewal every
// 400 ms, heartbeat every second), over a 20-second window, reported per
// minute for each instance.
func BenchmarkIdleRequests100(b *testing.B) {
	const (
		window    = 20 * time.Second
		elections = 100
	)
	prefix := newPrefix()
	var rec electortest.Recorder
	instance := func(id string) (*counter, []*sovereign.Elector) {
		n := new(counter)
		cfg := shared.ClientConfig()
		n.configure(&cfg)
		cli, err := clientv3.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		be, err := etcdbackend.New(cli, &etcdbackend.Options{Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			be.Close()
			cli.Close()
		})
		var es []*sovereign.Elector
		for i := range elections {
			e, err := sovereign.New(be, fmt.Sprintf("e%d", i), id, &sovereign.Options{
				TTL: 2 * time.Second, NoStartupJitter: true, Logger: electortest.Logger(),
			})
			if err != nil {
				b.Fatal(err)
			}
			rec.Campaign(b, e)
			es = append(es, e)
		}
		return n, es
	}
	leaderN, leaders := instance("leader")
	electortest.Eventually(b, "the first instance leads every election", func() bool {
		return len(electortest.Leaders(leaders...)) == elections
	})
	followerN, _ := instance("follower")
	<-time.After(3 * time.Second) // let the start-up traffic pass
	perMinute := func(n int64) float64 { return float64(n) * float64(time.Minute) / float64(window) }
	for b.Loop() {
		leaderN.reset()
		followerN.reset()
		<-time.After(window)
		b.ReportMetric(perMinute(leaderN.total()), "leader-requests/min")
		b.ReportMetric(perMinute(followerN.total()), "follower-requests/min")
		b.Logf("in %v: leader %v, follower %v", window, leaderN.byMethod(), followerN.byMethod())
	}
	if got := len(electortest.Leaders(leaders...)); got != elections {
		b.Fatalf("the leader lost %d elections while idle", elections-got)
	}
}

// TestFailedReleaseCleanedUp: a Release of a lease on a session that fails
// (the store unreachable) leaves nothing on the session once the store is
// back, although the caller gives up on it and other keys keep the session
// alive: the Backend deletes the record in the background.
func TestFailedReleaseCleanedUp(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	p := startProxy(t, shared.Endpoint(0))
	cli := newClient(t, nil, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.endpoint()} })
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix, RequestTimeout: 500 * time.Millisecond})
	raw := newClient(t, nil, nil)
	kept, err := b.Acquire(ctx, backend.AcquireRequest{Key: "kept", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "abandoned", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p.setCut(true)
	if err := b.Release(ctx, l); err == nil || errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("Release with the store unreachable: got %v, want a failure", err)
	}
	p.setCut(false)
	start := time.Now()
	for {
		// The session lives on: "kept" is renewed.
		if err := b.Renew(ctx, kept); err != nil && time.Since(start) > 10*time.Second {
			t.Fatalf("Renew of the kept lease: %v", err)
		}
		resp, err := raw.Get(ctx, prefix+"abandoned", clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 0 {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatal("the record of the failed Release is still on the session 20s later")
		}
		<-time.After(200 * time.Millisecond) // polling an observable condition
	}
	if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of the abandoned lease: got %v, want ErrLeaseLost", err)
	}
}

// TestOrphanSwept: a key on the session that this Backend neither holds nor
// is acquiring (an acquisition given up by its caller whose transaction
// committed late; written by hand here) is deleted by the next RenewBatch,
// instead of living as long as the session; the held keys stay.
func TestOrphanSwept(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	var leases []backend.Lease
	for _, k := range []string{"a", "b"} {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: k, HolderID: "a", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	id := sessionOf(t, cli, prefix+"a")
	if _, err := cli.Put(ctx, prefix+"orphan", "x", clientv3.WithLease(id)); err != nil {
		t.Fatal(err)
	}
	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Errorf("RenewBatch: lease %d: %v", i, err)
		}
	}
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key)[len(prefix):])
	}
	// The session's lease mark is not an orphan either.
	if want := []string{"\x00lease/" + strconv.FormatUint(uint64(id), 16), "a", "b"}; fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Errorf("keys after RenewBatch: got %q, want %q (the orphan deleted)", keys, want)
	}
	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Errorf("second RenewBatch: lease %d: %v", i, err)
		}
	}
}

// TestKeepAliveStream: a Backend's keep-alives go over one lease keep-alive
// stream, not one stream each, and a stream broken with the connection is
// opened again by the next keep-alive.
func TestKeepAliveStream(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	p := startProxy(t, shared.Endpoint(0))
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.Endpoints = []string{p.endpoint()}
		n.configure(cfg)
	})
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	renew := func(what string, times int, streams int64) {
		t.Helper()
		n.reset()
		for range times {
			if err := b.Renew(ctx, l); err != nil {
				t.Fatalf("%s: Renew: %v", what, err)
			}
		}
		if got := n.byMethod()["LeaseKeepAlive"]; got != int64(times) {
			t.Errorf("%s: %d Renews sent %d keep-alives, want %d", what, times, got, times)
		}
		if got := n.kaStreams.Load(); got > streams {
			t.Errorf("%s: %d keep-alive streams opened, want at most %d", what, got, streams)
		}
	}
	renew("first renewals", 10, 1)
	renew("renewals on the open stream", 3, 0)
	p.setCut(true)
	electortest.Eventually(t, "the client sees its connection down", func() bool {
		return cli.ActiveConnection().GetState() != connectivity.Ready
	})
	p.setCut(false)
	// The next renewals may fail while the client reconnects; then one
	// succeeds on a new stream.
	electortest.Eventually(t, "a renewal after the connection came back", func() bool {
		return b.Renew(ctx, l) == nil
	})
	// At most one stream: the renewal above may have opened it already.
	renew("renewals after a reconnection", 5, 1)
}
