package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// raftCounter counts the requests of a client that etcd turns into raft
// proposals (log entries every member writes): lease grants and
// revocations, puts, deletes, and transactions with a write in any branch
// (etcd proposes those even when their comparisons fail). Reads, read-only
// transactions, keep-alives and lease look-ups are served without one.
type raftCounter struct {
	mu      sync.Mutex // guards writes, methods
	writes  int
	methods map[string]int
}

// configure adds the counting interceptor to cfg.
func (c *raftCounter) configure(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			write := false
			switch r := req.(type) {
			case *etcdserverpb.LeaseGrantRequest, *etcdserverpb.LeaseRevokeRequest,
				*etcdserverpb.PutRequest, *etcdserverpb.DeleteRangeRequest:
				write = true
			case *etcdserverpb.TxnRequest:
				write = !readOnly(r)
			}
			if write {
				c.mu.Lock()
				c.writes++
				if c.methods == nil {
					c.methods = make(map[string]int)
				}
				c.methods[method]++
				c.mu.Unlock()
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
}

// readOnly reports whether etcd serves t without a raft proposal: only
// ranges in both branches (etcd's txn.IsTxnReadonly).
func readOnly(t *etcdserverpb.TxnRequest) bool {
	for _, ops := range [][]*etcdserverpb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if op.GetRequestRange() == nil {
				return false
			}
		}
	}
	return true
}

// take returns the writes since the last take, and resets the count.
func (c *raftCounter) take() (int, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, m := c.writes, maps.Clone(c.methods)
	c.writes, c.methods = 0, nil
	return n, m
}

// modesPair returns a Backend whose requests are counted, and another on
// the same prefix.
func modesPair(t *testing.T, n *counter, r *raftCounter) (counted, other *etcdbackend.Backend) {
	t.Helper()
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		if n != nil {
			n.configure(cfg)
		}
		if r != nil {
			r.configure(cfg)
		}
	})
	return newBackend(t, cli, opts), newBackend(t, newClient(t, nil, nil), opts)
}

func modeRequest(key, holder string, m backend.Mode) backend.ModeRequest {
	return backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: key, HolderID: holder, TTL: time.Minute}, Mode: m}
}

// TestModesRoundTrips counts the requests, and the raft proposals among
// them, of each operation of backend.Modes; the test's log is the table
// the package doc gives.
func TestModesRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	var r raftCounter
	b, other := modesPair(t, &n, &r)

	held, err := other.AcquireMode(ctx, modeRequest("held", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	sharedOther, err := other.AcquireMode(ctx, modeRequest("shared", "other", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	isHeld := func(err error) error {
		if errors.Is(err, backend.ErrHeld) {
			return nil
		}
		return fmt.Errorf("got %v, want ErrHeld", err)
	}
	var x, s, lim, tree backend.Lease
	waiter := modeRequest("held", "waiter", backend.Exclusive)
	waiter.WaitID = "w1"
	fair := modeRequest("held", "fair", backend.Exclusive)
	fair.Fair, fair.WaitID = true, "f1"
	steps := []struct {
		name        string
		do          func() error
		want, raftW int
	}{
		{"Exclusive of a free key (grant, txn)", func() (err error) {
			x, err = b.AcquireMode(ctx, modeRequest("x", "a", backend.Exclusive))
			return err
		}, 2, 2},
		{"Shared of a key with a Shared holder (grant, txn)", func() (err error) {
			s, err = b.AcquireMode(ctx, modeRequest("shared", "a", backend.Shared))
			return err
		}, 2, 2},
		{"Shared with limit 3, slot 0 taken (grant, txn)", func() (err error) {
			req := modeRequest("sem", "a", backend.Shared)
			req.Limit = 3
			if _, err := other.AcquireMode(ctx, req); err != nil {
				return err
			}
			lim, err = b.AcquireMode(ctx, req)
			return err
		}, 2, 2},
		{"Exclusive with 2 ancestors (grant, txn)", func() (err error) {
			req := modeRequest("t/a/b", "a", backend.Exclusive)
			req.Ancestors = []string{"t", "t/a"}
			tree, err = b.AcquireMode(ctx, req)
			return err
		}, 2, 2},
		{"Renew of an entry (read-only txn, keep-alive)", func() error { return b.Renew(ctx, tree) }, 2, 0},
		{"SetMetadata of an entry with 2 ancestors (txn)", func() error {
			return b.SetMetadata(ctx, tree, map[string]string{"k": "v"})
		}, 1, 1},
		{"Shared of a held key, no WaitID (grant, txn, revoke, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, modeRequest("held", "a", backend.Shared))
			return isHeld(err)
		}, 4, 3},
		{"Exclusive with WaitID of a held key, first try (grant, txn registering, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, waiter)
			return isHeld(err)
		}, 3, 2},
		{"the same, retried (keep-alive of the registration, read-only probe txn, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, waiter)
			return isHeld(err)
		}, 3, 0},
		{"Shared of a key found held before, no WaitID (read-only probe txn, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, modeRequest("held", "a", backend.Shared))
			return isHeld(err)
		}, 2, 0},
		{"Fair with WaitID of a held key, first try (grant, txn registering, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, fair)
			return isHeld(err)
		}, 3, 2},
		{"Holders of a key with 2 Shared holders (range, 2 lease look-ups)", func() error {
			recs, err := b.Holders(ctx, "shared")
			if err == nil && len(recs) != 2 {
				err = fmt.Errorf("got %d holders, want 2", len(recs))
			}
			return err
		}, 3, 0},
		{"Get of a key with Shared holders (txn, 1 lease look-up)", func() error {
			_, err := b.Get(ctx, "shared")
			return err
		}, 2, 0},
		{"CancelWait of a registration made here (revoke)", func() error { return b.CancelWait(ctx, "held", fair.WaitID) }, 1, 1},
		{"Release of an entry with 2 ancestors (txn, revoke)", func() error { return b.Release(ctx, tree) }, 2, 2},
		{"Release of a Shared entry (txn, revoke)", func() error { return b.Release(ctx, s) }, 2, 2},
		{"Release of a limited Shared entry (txn, revoke)", func() error { return b.Release(ctx, lim) }, 2, 2},
		{"CancelWait of a registration made elsewhere (txn, revoke)", func() error {
			w := modeRequest("x", "elsewhere", backend.Exclusive)
			w.WaitID = "w2"
			if err := isHeld(func() error { _, err := other.AcquireMode(ctx, w); return err }()); err != nil {
				return err
			}
			n.reset()
			r.take()
			return b.CancelWait(ctx, "x", w.WaitID)
		}, 2, 2},
		{"Release of an Exclusive entry (txn, revoke)", func() error { return b.Release(ctx, x) }, 2, 2},
	}
	for _, st := range steps {
		n.reset()
		r.take()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, byMethod := n.total(), n.byMethod()
		raftW, raftBy := r.take()
		t.Logf("%-95s %d requests %v, %d raft writes %v", st.name, got, byMethod, raftW, raftBy)
		if got != int64(st.want) || raftW != st.raftW {
			t.Errorf("%s: got %d requests %v and %d raft writes %v, want %d and %d", st.name, got, byMethod, raftW, raftBy, st.want, st.raftW)
		}
	}
	for _, l := range []backend.Lease{held, sharedOther} {
		if err := other.Release(ctx, l); err != nil {
			t.Error(err)
		}
	}
}

// TestModesRegisteredWaiterReusesItsLease checks the count of the step
// above that the table cannot measure: a registered waiter's successful
// acquisition refreshes its registration's lease and takes it over,
// with no grant.
func TestModesRegisteredWaiterReusesItsLease(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	var r raftCounter
	b, other := modesPair(t, &n, &r)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	// A waiter watches the key, as package lock's do: the release it sees
	// tells the backend the key may be free, so it skips the probe.
	events, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("k", "waiter", backend.Exclusive)
	w.WaitID = "w"
	for range 2 {
		if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
		}
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, events, "release", 10*time.Second); e.Type != backend.EventReleased {
		t.Fatalf("watch: got %v, want %v", e.Type, backend.EventReleased)
	}
	n.reset()
	r.take()
	l, err := b.AcquireMode(ctx, w)
	if err != nil {
		t.Fatalf("AcquireMode of the released key: %v", err)
	}
	got, byMethod := n.total(), n.byMethod()
	raftW, _ := r.take()
	if got != 2 || raftW != 1 || byMethod["LeaseGrant"] != 0 {
		t.Errorf("registered waiter's acquisition: got %d requests %v, %d raft writes; want 2 (keep-alive, txn), 1", got, byMethod, raftW)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Errorf("Renew of the lease taken over from the registration: %v", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestModesSlots: a limited Shared key is a set of slots; a released slot
// is taken again, the limit holds with every slot taken, and the largest
// limit (with its nested transaction) is accepted by etcd.
func TestModesSlots(t *testing.T) {
	ctx := testCtx(t)
	b, _ := modesPair(t, nil, nil)
	sem := func(key string, limit int, ancestors ...string) backend.ModeRequest {
		req := modeRequest(key, "h", backend.Shared)
		req.Limit, req.Ancestors = limit, ancestors
		return req
	}
	var ls []backend.Lease
	for range 3 {
		l, err := b.AcquireMode(ctx, sem("s", 3))
		if err != nil {
			t.Fatalf("AcquireMode: %v", err)
		}
		ls = append(ls, l)
	}
	if err := b.Release(ctx, ls[1]); err != nil {
		t.Fatal(err)
	}
	l, err := b.AcquireMode(ctx, sem("s", 3))
	if err != nil {
		t.Fatalf("AcquireMode after the release of the middle slot: %v", err)
	}
	var held *backend.HeldError
	if _, err := b.AcquireMode(ctx, sem("s", 3)); !errors.As(err, &held) || len(held.Holders) != 3 {
		t.Fatalf("AcquireMode with 3 slots taken: got %v, want a HeldError with 3 holders", err)
	}
	for _, l := range []backend.Lease{ls[0], l, ls[2]} {
		if err := b.Release(ctx, l); err != nil {
			t.Errorf("Release: %v", err)
		}
	}

	if _, err := b.AcquireMode(ctx, sem("big", etcdbackend.MaxLimit+1)); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("AcquireMode with limit %d: got %v, want ErrUnsupported", etcdbackend.MaxLimit+1, err)
	}
	// Every slot of the largest limit.
	ls = ls[:0]
	for i := range etcdbackend.MaxLimit {
		l, err := b.AcquireMode(ctx, sem("big", etcdbackend.MaxLimit))
		if err != nil {
			t.Fatalf("AcquireMode %d of %d: %v", i+1, etcdbackend.MaxLimit, err)
		}
		ls = append(ls, l)
	}
	if _, err := b.AcquireMode(ctx, sem("big", etcdbackend.MaxLimit)); !errors.As(err, &held) || len(held.Holders) != etcdbackend.MaxLimit {
		t.Fatalf("AcquireMode with every slot taken: got %v, want a HeldError with %d holders", err, etcdbackend.MaxLimit)
	}
	for _, l := range ls {
		if err := b.Release(ctx, l); err != nil {
			t.Errorf("Release: %v", err)
		}
	}
}

// TestModesWaiterRefreshIsSilent: a waiter's registration and its
// refreshes send no event (each would wake every waiter, whose retries
// would wake them again); its withdrawal sends EventChanged.
func TestModesWaiterRefreshIsSilent(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	events, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	w := modeRequest("k", "waiter", backend.Exclusive)
	w.WaitID = "w"
	for range 3 {
		if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("AcquireMode: got %v, want ErrHeld", err)
		}
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, events, "release", 10*time.Second); e.Type != backend.EventReleased {
		t.Fatalf("first event after 3 registrations and a release: got %v, want %v", e.Type, backend.EventReleased)
	}
	if err := b.CancelWait(ctx, "k", w.WaitID); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, events, "cancel wait", 10*time.Second); e.Type != backend.EventChanged {
		t.Fatalf("after CancelWait: got %v, want %v", e.Type, backend.EventChanged)
	}
}

// TestModesListShowsNoEntryKeys: List returns one record per holder under
// the holder's key, never the etcd keys of entries, intents or waiters.
func TestModesListShowsNoEntryKeys(t *testing.T) {
	ctx := testCtx(t)
	b, _ := modesPair(t, nil, nil)
	req := modeRequest("a/b", "h", backend.Shared)
	req.Ancestors = []string{"a"}
	for range 2 {
		if _, err := b.AcquireMode(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	w := modeRequest("a", "w", backend.Exclusive)
	w.WaitID = "w"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of an ancestor with locks below: got %v, want ErrHeld", err)
	}
	recs, err := b.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("List: got %d records %v, want 2", len(recs), recs)
	}
	for _, r := range recs {
		if r.Key != "a/b" || r.Mode != backend.Shared {
			t.Errorf("List: got a record of %q (%v), want %q (shared)", r.Key, r.Mode, "a/b")
		}
	}
	if recs[0].Term >= recs[1].Term {
		t.Errorf("List: terms %d, %d not in increasing order", recs[0].Term, recs[1].Term)
	}
}

// TestModesWaitIDChangingMode: a WaitID registered in one mode and used in
// the other leaves no registration of the first mode behind (it would
// block readers by writer preference for as long as the lock lives).
func TestModesWaitIDChangingMode(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("k", "w", backend.Exclusive)
	w.WaitID = "w"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode: got %v, want ErrHeld", err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	r := modeRequest("k", "w", backend.Shared)
	r.WaitID, r.Fair = "w", true
	var l backend.Lease
	for i := 0; ; i++ {
		if l, err = b.AcquireMode(ctx, r); err == nil {
			break
		}
		if i == 2 {
			t.Fatalf("Shared, Fair, with the WaitID of an Exclusive registration, on a free key: %v", err)
		}
	}
	// A reader that is not Fair yields to Exclusive waiters only.
	l2, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared))
	if err != nil {
		t.Fatalf("Shared reader after the WaitID changed mode: got %v, want nil (no Exclusive waiter left)", err)
	}
	for _, x := range []struct {
		b *etcdbackend.Backend
		l backend.Lease
	}{{b, l}, {other, l2}} {
		if err := x.b.Release(ctx, x.l); err != nil {
			t.Error(err)
		}
	}
}

// TestModesConcurrentSemaphore: goroutines on several Backends acquire a
// key as a semaphore of 2 or exclusively, concurrently; at no time do more
// than 2 hold it, nor anyone alongside an Exclusive holder. Each counts
// itself in after its acquisition returned and out before it releases, so
// the counts never exceed what the store holds.
func TestModesConcurrentSemaphore(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	const workers, attempts, limit = 6, 25, 2
	var (
		mu                sync.Mutex // guards the counts
		shared, exclusive int
		wins              [2]int // by mode
		violations        []string
	)
	var wg sync.WaitGroup
	for i := range workers {
		b := newBackend(t, newClient(t, nil, nil), opts)
		wg.Go(func() {
			for j := range attempts {
				req := modeRequest("sem", fmt.Sprintf("w%d", i), backend.Shared)
				req.Limit = limit
				if (i+j)%4 == 0 {
					req = modeRequest("sem", fmt.Sprintf("w%d", i), backend.Exclusive)
				}
				l, err := b.AcquireMode(ctx, req)
				if errors.Is(err, backend.ErrHeld) {
					continue
				}
				if err != nil {
					t.Errorf("AcquireMode: %v", err)
					return
				}
				mu.Lock()
				if req.Mode == backend.Exclusive {
					exclusive++
				} else {
					shared++
				}
				wins[req.Mode]++
				if shared > limit || exclusive > 1 || (exclusive > 0 && shared > 0) {
					violations = append(violations, fmt.Sprintf("%d shared and %d exclusive holders", shared, exclusive))
				}
				mu.Unlock()
				// Hold it for a read of the holders, which must agree.
				recs, err := b.Holders(ctx, "sem")
				if err != nil {
					t.Errorf("Holders: %v", err)
				}
				mu.Lock()
				if n := len(recs); n == 0 || n > limit || (req.Mode == backend.Exclusive && n != 1) {
					violations = append(violations, fmt.Sprintf("Holders of a %v holder: %d records", req.Mode, n))
				}
				if req.Mode == backend.Exclusive {
					exclusive--
				} else {
					shared--
				}
				mu.Unlock()
				if err := b.Release(ctx, l); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if len(violations) > 0 {
		t.Fatalf("the store let in too many holders: %v", violations)
	}
	if wins[backend.Shared]+wins[backend.Exclusive] == 0 {
		// The first transaction on the free key cannot fail.
		t.Errorf("no acquisition succeeded")
	}
	t.Logf("%d shared and %d exclusive acquisitions of %d attempts", wins[backend.Shared], wins[backend.Exclusive], workers*attempts)
}

// TestModesLargestTransactions: for each shape of request, the most
// ancestors AcquireMode accepts make a transaction etcd accepts (with its
// default --max-txn-ops), on a held key (the failure branch registering a
// waiter) and on a free one; one more ancestor is refused with
// ErrUnsupported before any request.
func TestModesLargestTransactions(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	shapes := []struct {
		name  string
		mode  backend.Mode
		limit int
		fair  bool
		wait  bool
	}{
		{"exclusive", backend.Exclusive, 0, false, false},
		{"exclusive waiting", backend.Exclusive, 0, false, true},
		{"exclusive fair waiting", backend.Exclusive, 0, true, true},
		{"shared", backend.Shared, 0, false, false},
		{"shared fair waiting", backend.Shared, 0, true, true},
		{"semaphore of MaxLimit", backend.Shared, etcdbackend.MaxLimit, false, false},
		{"semaphore of MaxLimit, fair waiting", backend.Shared, etcdbackend.MaxLimit, true, true},
		{"semaphore of 3, fair waiting", backend.Shared, 3, true, true},
	}
	for k, sh := range shapes {
		req := func(n int) backend.ModeRequest {
			key := fmt.Sprintf("t%d", k)
			var ancestors []string
			for i := range n {
				ancestors = append(ancestors, key)
				key += fmt.Sprintf("/%d", i)
			}
			r := modeRequest(key, "h", sh.mode)
			r.Limit, r.Fair, r.Ancestors = sh.limit, sh.fair, ancestors
			if sh.wait {
				r.WaitID = "w"
			}
			return r
		}
		n := 0
		for etcdbackend.TxnOps(req(n+1)) <= 128 {
			n++
		}
		r := req(n)
		// Held by an Exclusive lock on the key itself.
		x, err := other.AcquireMode(ctx, modeRequest(r.Key, "other", backend.Exclusive))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
			t.Errorf("%s with %d ancestors, held key: got %v, want ErrHeld", sh.name, n, err)
		}
		if err := other.Release(ctx, x); err != nil {
			t.Fatal(err)
		}
		l, err := b.AcquireMode(ctx, r)
		if err != nil {
			t.Errorf("%s with %d ancestors, free key: got %v, want nil", sh.name, n, err)
		} else if err := b.Release(ctx, l); err != nil {
			t.Error(err)
		}
		if _, err := b.AcquireMode(ctx, req(n+1)); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("%s with %d ancestors: got %v, want ErrUnsupported", sh.name, n+1, err)
		}
		t.Logf("%s: at most %d ancestors", sh.name, n)
	}
}

// TestModesLostIntentLosesTheEntry: an entry whose intent on an ancestor
// has gone (deleted by hand) no longer protects its tree, so Renew and
// SetMetadata report it lost; Release still removes what is left.
func TestModesLostIntentLosesTheEntry(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	req := modeRequest("a/b", "h", backend.Exclusive)
	req.Ancestors = []string{"a"}
	l, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Fatalf("Renew with its intent: %v", err)
	}
	resp, err := raw.Delete(ctx, prefix+"a\x00i", clientv3.WithPrefix())
	if err != nil || resp.Deleted != 1 {
		t.Fatalf("deleting the intent by hand: deleted %d, err %v; want 1, nil", resp.Deleted, err)
	}
	if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew without its intent: got %v, want ErrLeaseLost", err)
	}
	if err := b.SetMetadata(ctx, l, map[string]string{"k": "v"}); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("SetMetadata without its intent: got %v, want ErrLeaseLost", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Errorf("Release without its intent: got %v, want nil", err)
	}
	if recs, err := b.Holders(ctx, "a/b"); err != nil || len(recs) != 0 {
		t.Errorf("Holders after Release: got %v, %v; want none", recs, err)
	}
}
