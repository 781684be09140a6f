package etcdbackend_test

import (
	"context"
	"path"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestCleanUpSparesANewRecord: the background clean-up of a lease whose
// Release failed (or whose acquisition's outcome is unknown) is
// owner-checked by its token: when the key has been acquired again since,
// on the same session, by this Backend, the clean-up leaves the new
// record alone, and so does the clean-up of a later acquisition that found
// the key held; the clean-up of the new lease's token does delete it. (A
// mutation dropping the token comparisons, leaving the session lease's
// alone, deleted the new holder's record and no test saw it.)
func TestCleanUpSparesANewRecord(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	// Each transaction the Backend's client completes is reported here.
	txns := make(chan struct{}, 64)
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if path.Base(method) == "Txn" {
					select {
					case txns <- struct{}{}:
					default:
					}
				}
				return err
			}))
	})
	raw := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second}
	old, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Release(ctx, old); err != nil {
		t.Fatalf("Release: %v", err)
	}
	cur, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("second Acquire: %v", err)
	}
	if etcdbackend.LeaseOfToken(cur.Token) != etcdbackend.LeaseOfToken(old.Token) {
		t.Fatalf("the two acquisitions went on different sessions (%x, %x): the test needs one", etcdbackend.LeaseOfToken(old.Token), etcdbackend.LeaseOfToken(cur.Token))
	}
	// cleanUp waits for its transaction's reply, so one completed
	// transaction after this point is its (nothing else runs here).
	cleanUp := func(l backend.Lease) {
		t.Helper()
		for len(txns) > 0 {
			<-txns
		}
		etcdbackend.CleanUp(b, l)
		select {
		case <-txns:
		case <-time.After(20 * time.Second):
			t.Fatal("the clean-up sent no transaction within 20s")
		}
	}
	record := func() *clientv3.GetResponse {
		t.Helper()
		resp, err := raw.Get(ctx, prefix+"k")
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	cleanUp(old)
	if resp := record(); len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != int64(cur.Term) {
		t.Fatalf("after the clean-up of the released lease: got %v, want the new holder's record (term %d) still there", resp.Kvs, cur.Term)
	}
	if err := b.Renew(ctx, cur); err != nil {
		t.Errorf("Renew of the new lease after the old one's clean-up: got %v, want nil", err)
	}
	// An acquisition of the key by this Backend whose outcome is unknown,
	// made after cur (its token sorts after cur's), is cleaned up too; the key
	// was held, so it wrote nothing, and cur stays.
	later := cur
	later.Token = etcdbackend.SessionToken(etcdbackend.LeaseOfToken(cur.Token), time.Now().Add(time.Hour))
	cleanUp(later)
	if resp := record(); len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != int64(cur.Term) {
		t.Fatalf("after the clean-up of a later acquisition: got %v, want the holder's record (term %d) still there", resp.Kvs, cur.Term)
	}

	cleanUp(cur)
	if resp := record(); len(resp.Kvs) != 0 {
		t.Errorf("after the clean-up of the current lease: got %v, want its record deleted", resp.Kvs)
	}
}

// TestDeleteOrphansOwnerChecked: RenewBatch deletes an orphan (a key on its
// session that it neither holds nor is acquiring) only while that key is
// still attached to the session lease and was created at or before the
// look-up that found it: a key created since (an acquisition that
// committed after the look-up) and a key attached to another lease are
// left alone. (Mutations dropping either comparison survived every test.)
func TestDeleteOrphansOwnerChecked(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	session := etcdbackend.LeaseOfToken(l.Token)
	late := prefix + "late"
	put, err := cli.Put(ctx, late, "x", clientv3.WithLease(clientv3.LeaseID(session)))
	if err != nil {
		t.Fatal(err)
	}
	created := put.Header.Revision
	grant, err := cli.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = cli.Revoke(context.Background(), grant.ID) })
	other := prefix + "other"
	put, err = cli.Put(ctx, other, "x", clientv3.WithLease(grant.ID))
	if err != nil {
		t.Fatal(err)
	}
	now := put.Header.Revision
	exists := func(k string) bool {
		t.Helper()
		resp, err := cli.Get(ctx, k, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count == 1
	}

	etcdbackend.DeleteOrphans(ctx, b, session, []string{late}, created-1)
	if !exists(late) {
		t.Errorf("a key created after the look-up's revision was deleted as an orphan")
	}
	etcdbackend.DeleteOrphans(ctx, b, session, []string{other}, now)
	if !exists(other) {
		t.Errorf("a key attached to another lease was deleted as an orphan of the session")
	}
	etcdbackend.DeleteOrphans(ctx, b, session, []string{late}, created)
	if exists(late) {
		t.Errorf("an orphan on the session, created at the look-up's revision, was not deleted")
	}
	if !exists(prefix + "held") {
		t.Errorf("the held key went with the orphans")
	}
}
