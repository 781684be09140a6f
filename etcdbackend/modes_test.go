package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
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
// the package doc gives. Entries that are not Detached ride on the
// session lease of their TTL: once it is granted, an acquisition is one
// transaction, a release one transaction, and renewals of any number of
// them are the session's keep-alive and look-up.
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
	var x, s, lim, tree, det backend.Lease
	waiter := modeRequest("held", "waiter", backend.Exclusive)
	waiter.WaitID = "w1"
	fair := modeRequest("held", "fair", backend.Exclusive)
	fair.Fair, fair.WaitID = true, "f1"
	steps := []struct {
		name        string
		do          func() error
		want, raftW int
	}{
		{"Exclusive of a free key, first use of its TTL (grant of the session, txn putting its lease mark too)", func() (err error) {
			x, err = b.AcquireMode(ctx, modeRequest("x", "a", backend.Exclusive))
			return err
		}, 2, 2},
		{"Shared of a key with a Shared holder (txn)", func() (err error) {
			s, err = b.AcquireMode(ctx, modeRequest("shared", "a", backend.Shared))
			return err
		}, 1, 1},
		{"Shared with limit 3, slot 0 taken (txn)", func() (err error) {
			req := modeRequest("sem", "a", backend.Shared)
			req.Limit = 3
			if _, err := other.AcquireMode(ctx, req); err != nil {
				return err
			}
			n.reset()
			r.take()
			lim, err = b.AcquireMode(ctx, req)
			return err
		}, 1, 1},
		{"Exclusive with 2 ancestors (txn)", func() (err error) {
			req := modeRequest("t/a/b", "a", backend.Exclusive)
			req.Ancestors = []string{"t", "t/a"}
			tree, err = b.AcquireMode(ctx, req)
			return err
		}, 1, 1},
		{"Exclusive, Detached (grant, txn)", func() (err error) {
			req := modeRequest("det", "a", backend.Exclusive)
			req.Detached = true
			det, err = b.AcquireMode(ctx, req)
			return err
		}, 2, 2},
		{"Renew of an entry (read-only txn and keep-alive of the session, sent together)", func() error { return b.Renew(ctx, tree) }, 2, 0},
		{"RenewBatch of 4 entries on the session (keep-alive and look-up of the session, sent together)", func() error {
			return errors.Join(b.RenewBatch(ctx, []backend.Lease{x, s, lim, tree})...)
		}, 2, 0},
		{"Renew of a Detached entry (read-only txn, keep-alive)", func() error { return b.Renew(ctx, det) }, 2, 0},
		{"SetMetadata of an entry with 2 ancestors (txn)", func() error {
			return b.SetMetadata(ctx, tree, map[string]string{"k": "v"})
		}, 1, 1},
		{"Shared of a held key, no WaitID (txn, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, modeRequest("held", "a", backend.Shared))
			return isHeld(err)
		}, 2, 1},
		{"Exclusive with WaitID of a held key, first try (txn registering, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, waiter)
			return isHeld(err)
		}, 2, 1},
		{"the same, retried (read-only probe txn, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, waiter)
			return isHeld(err)
		}, 2, 0},
		{"Shared of a key found held before, no WaitID (read-only probe txn, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, modeRequest("held", "a", backend.Shared))
			return isHeld(err)
		}, 2, 0},
		{"Fair with WaitID of a held key, first try (txn registering, 1 lease look-up)", func() error {
			_, err := b.AcquireMode(ctx, fair)
			return isHeld(err)
		}, 2, 1},
		{"Exclusive, Detached, of a held key, no WaitID (read-only probe txn, 1 lease look-up)", func() error {
			req := modeRequest("held", "a", backend.Exclusive)
			req.Detached = true
			_, err := b.AcquireMode(ctx, req)
			return isHeld(err)
		}, 2, 0},
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
		{"CancelWait of a registration made here (txn)", func() error { return b.CancelWait(ctx, "held", fair.WaitID) }, 1, 1},
		{"Release of an entry with 2 ancestors (txn: no markers, so no lease for them)", func() error { return b.Release(ctx, tree) }, 1, 1},
		{"Release of a Shared entry (txn)", func() error { return b.Release(ctx, s) }, 1, 1},
		{"Release of a limited Shared entry (txn)", func() error { return b.Release(ctx, lim) }, 1, 1},
		{"CancelWait of a registration made elsewhere (txn)", func() error {
			w := modeRequest("x", "elsewhere", backend.Exclusive)
			w.WaitID = "w2"
			if err := isHeld(func() error { _, err := other.AcquireMode(ctx, w); return err }()); err != nil {
				return err
			}
			n.reset()
			r.take()
			return b.CancelWait(ctx, "x", w.WaitID)
		}, 1, 1},
		{"Release of an Exclusive entry (txn)", func() error { return b.Release(ctx, x) }, 1, 1},
		{"Release of a Detached entry (txn, revoke)", func() error { return b.Release(ctx, det) }, 2, 2},
	}
	for _, st := range steps {
		n.reset()
		r.take()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, byMethod := n.total(), n.byMethod()
		raftW, raftBy := r.take()
		t.Logf("%-100s %d requests %v, %d raft writes %v", st.name, got, byMethod, raftW, raftBy)
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

// TestModesRegisteredWaiterAcquiresInOneTransaction checks the count of
// the step above that the table cannot measure: a registered waiter's
// successful acquisition is one transaction, which deletes its
// registration, with no grant and no keep-alive.
func TestModesRegisteredWaiterAcquiresInOneTransaction(t *testing.T) {
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
	for {
		// A reset (the connection broke and came back) is not the
		// release; the release comes after it.
		e := nextEvent(t, events, "release", 10*time.Second)
		if e.Type == backend.EventReleased {
			break
		}
		if e.Type != backend.EventReset {
			t.Fatalf("watch: got %v, want %v", e.Type, backend.EventReleased)
		}
	}
	n.reset()
	r.take()
	l, err := b.AcquireMode(ctx, w)
	if err != nil {
		t.Fatalf("AcquireMode of the released key: %v", err)
	}
	got, byMethod := n.total(), n.byMethod()
	raftW, _ := r.take()
	if got != 1 || raftW != 1 || byMethod["Txn"] != 1 {
		t.Errorf("registered waiter's acquisition: got %d requests %v, %d raft writes; want 1 (txn), 1", got, byMethod, raftW)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Errorf("Renew: %v", err)
	}
	// The registration went with the success: a Shared reader is not
	// refused by writer preference once the lock is released.
	if err := b.Release(ctx, l); err != nil {
		t.Errorf("Release: %v", err)
	}
	if l, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared)); err != nil {
		t.Errorf("Shared acquisition after the waiter acquired and released: got %v, want nil (no waiter left)", err)
	} else if err := other.Release(ctx, l); err != nil {
		t.Error(err)
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
// would wake them again); its withdrawal sends EventChanged. A spurious
// EventReset (startMonitor) is no change, and is skipped.
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
	if e := nextNonReset(t, events, "release"); e.Type != backend.EventReleased {
		t.Fatalf("first event after 3 registrations and a release: got %v, want %v", e.Type, backend.EventReleased)
	}
	if err := b.CancelWait(ctx, "k", w.WaitID); err != nil {
		t.Fatal(err)
	}
	if e := nextNonReset(t, events, "cancel wait"); e.Type != backend.EventChanged {
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

// entryLeases returns the etcd lease of every entry key (holder, intent,
// waiter) under prefix+key, read through raw.
func entryLeases(t *testing.T, ctx context.Context, raw *clientv3.Client, prefix, key string) map[string]int64 {
	t.Helper()
	resp, err := raw.Get(ctx, prefix+key+"\x00", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64)
	for _, kv := range resp.Kvs {
		if len(kv.Key) > len(prefix+key+"\x00") { // not the release marker
			out[string(kv.Key)[len(prefix):]] = kv.Lease
		}
	}
	return out
}

// TestModesEntriesRideOnTheSession: an entry that is not Detached, its
// intents and a waiter registration are attached to the session lease
// of their TTL (one of the Backend's shared leases); a Detached entry and
// its intents to a lease of their own, revoked by its Release.
func TestModesEntriesRideOnTheSession(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})

	req := modeRequest("a/b", "h", backend.Shared)
	req.Ancestors = []string{"a"}
	l, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.AcquireMode(ctx, modeRequest("w", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("w", "waiter", backend.Exclusive)
	w.WaitID = "wait"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	shared := etcdbackend.SharedLeases(b)
	for _, key := range []string{"a/b", "a"} {
		for k, id := range entryLeases(t, ctx, raw, prefix, key) {
			if !shared[id] {
				t.Errorf("entry key %q: got etcd lease %x, want one of the Backend's session leases %v", k, id, shared)
			}
		}
	}
	regs := entryLeases(t, ctx, raw, prefix, "w")
	found := false
	for k, id := range regs {
		if strings.Contains(k, "\x00wx/") {
			found = true
			if !shared[id] {
				t.Errorf("registration %q: got etcd lease %x, want one of the Backend's session leases %v", k, id, shared)
			}
		}
	}
	if !found {
		t.Errorf("no registration under %q: %v", "w", regs)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := b.CancelWait(ctx, "w", w.WaitID); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}

	det := modeRequest("d/e", "h", backend.Exclusive)
	det.Ancestors, det.Detached = []string{"d"}, true
	dl, err := b.AcquireMode(ctx, det)
	if err != nil {
		t.Fatal(err)
	}
	var own int64
	for _, key := range []string{"d/e", "d"} {
		for k, id := range entryLeases(t, ctx, raw, prefix, key) {
			if shared[id] || id == 0 || (own != 0 && id != own) {
				t.Errorf("Detached entry key %q: got etcd lease %x, want one lease of its own, not a shared one", k, id)
			}
			own = id
		}
	}
	if err := b.Release(ctx, dl); err != nil {
		t.Fatal(err)
	}
	if resp, err := raw.TimeToLive(ctx, clientv3.LeaseID(own)); err != nil || resp.TTL != -1 {
		t.Errorf("the Detached entry's lease after its Release: got TTL %v (err %v), want -1 (revoked)", resp.TTL, err)
	}
}

// TestModesOrphanSweepKeepsEntries: RenewBatch's sweep of the session's
// orphans deletes a key on the session that this Backend does not hold,
// and leaves alone its live entries, their intents and its waiter
// registrations, which keep doing their work afterwards.
func TestModesOrphanSweepKeepsEntries(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})

	req := modeRequest("a/b", "h", backend.Exclusive)
	req.Ancestors = []string{"a"}
	l, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	sem := modeRequest("s", "h", backend.Shared)
	sem.Limit = 2
	sl, err := b.AcquireMode(ctx, sem)
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.AcquireMode(ctx, modeRequest("w", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("w", "waiter", backend.Exclusive)
	w.WaitID = "wait"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	// An orphan: an entry key on the session that nobody holds.
	var session int64
	for k, id := range entryLeases(t, ctx, raw, prefix, "a/b") {
		if strings.Contains(k, "\x00hx/") {
			session = id
		}
	}
	orphan := prefix + "o\x00hx/orphan"
	if _, err := raw.Put(ctx, orphan, "x", clientv3.WithLease(clientv3.LeaseID(session))); err != nil {
		t.Fatal(err)
	}

	for i, err := range b.RenewBatch(ctx, []backend.Lease{l, sl}) {
		if err != nil {
			t.Errorf("RenewBatch, lease %d: %v", i, err)
		}
	}
	if resp, err := raw.Get(ctx, orphan); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the orphan after RenewBatch: got %d keys (err %v), want it deleted", len(resp.Kvs), err)
	}
	// Everything else is still there and at work.
	for i, err := range b.RenewBatch(ctx, []backend.Lease{l, sl}) {
		if err != nil {
			t.Errorf("second RenewBatch, lease %d: %v", i, err)
		}
	}
	if recs, err := other.Holders(ctx, "a/b"); err != nil || len(recs) != 1 {
		t.Errorf("Holders of the entry: got %v, %v; want 1 record", recs, err)
	}
	if _, err := other.AcquireMode(ctx, modeRequest("a", "x", backend.Exclusive)); !errors.Is(err, backend.ErrHeld) {
		t.Errorf("Exclusive on the ancestor (the entry's intent there): got %v, want ErrHeld", err)
	}
	if recs, err := other.Holders(ctx, "s"); err != nil || len(recs) != 1 {
		t.Errorf("Holders of the semaphore: got %v, %v; want 1 record", recs, err)
	}
	var he *backend.HeldError
	if _, err := other.AcquireMode(ctx, modeRequest("w", "reader", backend.Shared)); !errors.As(err, &he) || he.Waiting != 1 {
		t.Errorf("Shared on the key with the registration: got %v, want a HeldError with Waiting 1", err)
	}
	for _, x := range []struct {
		b *etcdbackend.Backend
		l backend.Lease
	}{{b, l}, {b, sl}, {other, held}} {
		if err := x.b.Release(ctx, x.l); err != nil {
			t.Errorf("Release of %q: %v", x.l.Key, err)
		}
	}
	if err := b.CancelWait(ctx, "w", w.WaitID); err != nil {
		t.Error(err)
	}
}

// TestModesRegistrationExpires: a registration on the session that its
// waiter stops refreshing (without CancelWait) is withdrawn by its
// Backend at its TTL, counted from the send time of its last refresh,
// while the session lives on with the Backend's other keys; a refresh
// moves that time. The key has a Shared holder, so a Shared reader is
// refused by the Exclusive waiter alone (writer preference).
func TestModesRegistrationExpires(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := b.AcquireMode(ctx, modeRequest("keep", "h", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("k", "waiter", backend.Exclusive)
	w.WaitID = "wait"
	before := time.Now()
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	after := time.Now()
	if at := etcdbackend.RegistrationTimer(b); at.Before(before.Add(w.TTL)) || at.After(after.Add(w.TTL)) {
		t.Errorf("the withdrawal timer: got %v, want between %v and %v (the registration's TTL after its send time)", at, before.Add(w.TTL), after.Add(w.TTL))
	}
	reader := func() error {
		l, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared))
		if err == nil {
			err = other.Release(ctx, l)
		}
		return err
	}
	// A refresh: due a TTL after its send time, not before.
	refreshed := time.Now()
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("retry: got %v, want ErrHeld", err)
	}
	if !refreshed.After(after) {
		t.Fatalf("the clock did not move: %v, %v", after, refreshed)
	}
	// Past the first registration's TTL, within the refresh's.
	etcdbackend.ExpireRegistrations(b, after.Add(w.TTL))
	var he *backend.HeldError
	if err := reader(); !errors.As(err, &he) || he.Waiting != 1 {
		t.Fatalf("Shared before the registration's TTL: got %v, want a HeldError with Waiting 1", err)
	}
	etcdbackend.ExpireRegistrations(b, time.Now().Add(w.TTL))
	if err := reader(); err != nil {
		t.Errorf("Shared after the registration's TTL: got %v, want nil (withdrawn)", err)
	}
	if err := b.Renew(ctx, keep); err != nil {
		t.Errorf("Renew of an entry on the same session: %v", err)
	}
	// The waiter comes back: it registers again.
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode after the withdrawal: got %v, want ErrHeld", err)
	}
	if err := reader(); !errors.As(err, &he) || he.Waiting != 1 {
		t.Errorf("Shared after the waiter registered again: got %v, want a HeldError with Waiting 1", err)
	}
	if err := b.CancelWait(ctx, "k", w.WaitID); err != nil {
		t.Error(err)
	}
	for _, x := range []struct {
		b *etcdbackend.Backend
		l backend.Lease
	}{{b, keep}, {other, held}} {
		if err := x.b.Release(ctx, x.l); err != nil {
			t.Error(err)
		}
	}
}

// TestModesSessionLost: when the session lease is gone (revoked by hand
// here; expired in life), the entries on it are lost (Renew and
// RenewBatch say so) and the next AcquireMode grants a new session.
func TestModesSessionLost(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	l, err := b.AcquireMode(ctx, modeRequest("a", "h", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	for id := range etcdbackend.SharedLeases(b) {
		if _, err := raw.Revoke(ctx, clientv3.LeaseID(id)); err != nil {
			t.Fatal(err)
		}
	}
	l2, err := b.AcquireMode(ctx, modeRequest("b", "h", backend.Shared))
	if err != nil {
		t.Fatalf("AcquireMode after the session was revoked: got %v, want a lease on a new session", err)
	}
	if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of an entry on the revoked session: got %v, want ErrLeaseLost", err)
	}
	errs := b.RenewBatch(ctx, []backend.Lease{l, l2})
	if !errors.Is(errs[0], backend.ErrLeaseLost) || errs[1] != nil {
		t.Errorf("RenewBatch: got %v, want ErrLeaseLost for the lost entry and nil for the new one", errs)
	}
	if err := b.Release(ctx, l2); err != nil {
		t.Error(err)
	}
}

// TestModesFailedReleaseCleanedUp: a Release of an entry on a session that
// fails (the store unreachable) leaves nothing of it on the session once
// the store is back (holder key and intents), although the caller gives up
// on it and another entry keeps the session alive.
func TestModesFailedReleaseCleanedUp(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	p := startProxy(t, shared.Endpoint(0))
	cli := newClient(t, nil, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.endpoint()} })
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix, RequestTimeout: 500 * time.Millisecond})
	raw := newClient(t, nil, nil)
	kept, err := b.AcquireMode(ctx, modeRequest("kept", "a", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	req := modeRequest("t/a/b", "a", backend.Shared)
	req.Ancestors = []string{"t", "t/a"}
	l, err := b.AcquireMode(ctx, req)
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
			t.Fatalf("Renew of the kept entry: %v", err)
		}
		resp, err := raw.Get(ctx, prefix+"t", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, kv := range resp.Kvs {
			if k := string(kv.Key); k[len(k)-1] != 0 { // not a release marker
				left = append(left, k[len(prefix):])
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the entry of the failed Release is still on the session 20s later: %q", left)
		}
		<-time.After(200 * time.Millisecond) // polling an observable condition
	}
	if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of the abandoned entry: got %v, want ErrLeaseLost", err)
	}
	if err := b.Release(ctx, kept); err != nil {
		t.Error(err)
	}
}

// TestModesDetachedAndRegistrationExpire: while an entry on the session is
// renewed (keeping the session alive), a Detached entry of the same TTL
// that nobody renews ends at its TTL, and so does a waiter registration
// that its waiter stopped refreshing (withdrawn by the Backend's timer).
func TestModesDetachedAndRegistrationExpire(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	const ttl = 3 * time.Second
	short := func(key, holder string, m backend.Mode) backend.ModeRequest {
		r := modeRequest(key, holder, m)
		r.TTL = ttl
		return r
	}
	kept, err := b.AcquireMode(ctx, short("kept", "a", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	dreq := short("detached", "a", backend.Exclusive)
	dreq.Detached = true
	d, err := b.AcquireMode(ctx, dreq)
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	w := short("k", "waiter", backend.Exclusive)
	w.WaitID = "wait"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	start := time.Now()
	detachedGone, registrationGone := false, false
	for !detachedGone || !registrationGone {
		if errs := b.RenewBatch(ctx, []backend.Lease{kept}); errs[0] != nil {
			t.Fatalf("RenewBatch of the entry on the session: %v", errs[0])
		}
		if !detachedGone {
			recs, err := other.Holders(ctx, "detached")
			if err != nil {
				t.Fatal(err)
			}
			if detachedGone = len(recs) == 0; detachedGone {
				t.Logf("the Detached entry ended %v after its acquisition (TTL %v)", time.Since(start), ttl)
			}
		}
		if !registrationGone {
			l, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared))
			var he *backend.HeldError
			switch {
			case err == nil:
				registrationGone = true
				t.Logf("the registration was withdrawn %v after it was made (TTL %v)", time.Since(start), ttl)
				if err := other.Release(ctx, l); err != nil {
					t.Fatal(err)
				}
			case !errors.As(err, &he) || he.Waiting != 1:
				t.Fatalf("Shared acquisition: got %v, want nil or a HeldError with Waiting 1", err)
			}
		}
		if time.Since(start) > 6*ttl {
			t.Fatalf("%v after: Detached entry gone %v, registration gone %v; want both (TTL %v)", time.Since(start), detachedGone, registrationGone, ttl)
		}
		<-time.After(300 * time.Millisecond) // polling observable conditions
	}
	if err := b.Renew(ctx, d); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of the expired Detached entry: got %v, want ErrLeaseLost", err)
	}
	for _, x := range []struct {
		b *etcdbackend.Backend
		l backend.Lease
	}{{b, kept}, {other, held}} {
		if err := x.b.Release(ctx, x.l); err != nil {
			t.Error(err)
		}
	}
}

// TestModesKeepAliveWithTheTransaction: an AcquireMode made when the
// session has less than the TTL asked for left sends a keep-alive of the
// session with its transaction (two requests, one round trip), and its
// lease lasts the session's full TTL; with enough left, the transaction
// alone, and the lease says what the session has left. A registered
// waiter's probe does the same for its registration.
func TestModesKeepAliveWithTheTransaction(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	b, other := modesPair(t, &n, nil)
	req := func(key string) backend.ModeRequest {
		r := modeRequest(key, "a", backend.Exclusive)
		r.TTL = 16 * time.Second // a session of 18 s: 2 s of headroom
		return r
	}
	first, err := b.AcquireMode(ctx, req("first"))
	if err != nil {
		t.Fatal(err)
	}
	full := req("").TTL + etcdbackend.SessionHeadroom(req("").TTL)

	n.reset()
	l, err := b.AcquireMode(ctx, req("fresh"))
	if err != nil {
		t.Fatal(err)
	}
	if got, by := n.total(), n.byMethod(); got != 1 || by["Txn"] != 1 {
		t.Errorf("AcquireMode on a fresh session: got %d requests %v, want 1 (txn)", got, by)
	}
	if l.TTL < req("").TTL || l.TTL > full {
		t.Errorf("AcquireMode on a fresh session: got Lease.TTL %v, want between %v and %v", l.TTL, req("").TTL, full)
	}

	etcdbackend.AgeSessions(b, 3*time.Second) // 15 s left of 18: less than 16
	n.reset()
	l2, err := b.AcquireMode(ctx, req("aged"))
	if err != nil {
		t.Fatal(err)
	}
	if got, by := n.total(), n.byMethod(); got != 2 || by["Txn"] != 1 || by["LeaseKeepAlive"] != 1 {
		t.Errorf("AcquireMode on an aged session: got %d requests %v, want 2 (txn and keep-alive, sent together)", got, by)
	}
	if l2.TTL != full {
		t.Errorf("AcquireMode on an aged session: got Lease.TTL %v, want the session's full %v", l2.TTL, full)
	}

	// A registered waiter's retry on an aged session.
	held, err := other.AcquireMode(ctx, modeRequest("held", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	w := req("held")
	w.WaitID = "wait"
	for range 2 {
		if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
		}
	}
	etcdbackend.AgeSessions(b, 3*time.Second)
	n.reset()
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	if got, by := n.total(), n.byMethod(); got != 3 || by["Txn"] != 1 || by["LeaseKeepAlive"] != 1 || by["LeaseTimeToLive"] != 1 {
		t.Errorf("a registered waiter's retry on an aged session: got %d requests %v, want 3 (probe and keep-alive sent together, 1 lease look-up)", got, by)
	}
	if err := b.CancelWait(ctx, "held", w.WaitID); err != nil {
		t.Error(err)
	}
	for _, x := range []struct {
		b *etcdbackend.Backend
		l backend.Lease
	}{{b, first}, {b, l}, {b, l2}, {other, held}} {
		if err := x.b.Release(ctx, x.l); err != nil {
			t.Error(err)
		}
	}
}

// TestModesAncestorWaitersBlockASemaphoreBelow: the ancestor-waiter rule
// holds for a semaphore below too, whose failure is read in the last level
// of its chain of slot transactions: the HeldError names the ancestor and
// counts its Exclusive waiters; the semaphore's own holders are untouched.
func TestModesAncestorWaitersBlockASemaphoreBelow(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	sem := modeRequest("a/s", "h", backend.Shared)
	sem.Limit, sem.Ancestors = 3, []string{"a"}
	l, err := b.AcquireMode(ctx, sem)
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("a", "writer", backend.Exclusive)
	w.WaitID = "wait"
	if _, err := other.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Exclusive on the ancestor: got %v, want ErrHeld", err)
	}
	var he *backend.HeldError
	_, err = b.AcquireMode(ctx, sem)
	if !errors.As(err, &he) || len(he.Holders) != 0 || he.Waiting != 1 || he.Holder.Key != "a" {
		t.Fatalf("a second permit below the waiting writer: got %v (%+v), want a HeldError naming %q with Waiting 1 and no holders", err, he, "a")
	}
	if recs, err := other.Holders(ctx, "a/s"); err != nil || len(recs) != 1 {
		t.Errorf("Holders of the semaphore: got %v, %v; want the first permit alone", recs, err)
	}
	if err := other.CancelWait(ctx, "a", w.WaitID); err != nil {
		t.Fatal(err)
	}
	l2, err := b.AcquireMode(ctx, sem)
	if err != nil {
		t.Fatalf("a second permit once the writer withdrew: %v", err)
	}
	for _, x := range []backend.Lease{l, l2} {
		if err := b.Release(ctx, x); err != nil {
			t.Error(err)
		}
	}
}
