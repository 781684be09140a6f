package etcdbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

// heartbeatBody is the value of a heartbeat record.
type heartbeatBody struct {
	ID string `json:"id"`
	// At is the writer's clock when the record was written (not when it
	// was last kept alive). Informational.
	At time.Time `json:"at"`
	// Session marks a record on a heartbeat session of HeartbeatBatch,
	// whose lease other records share: RemoveMember does not revoke it.
	Session bool `json:"session,omitempty"`
}

// hbEntry is the etcd lease this backend keeps a heartbeat record alive
// with.
type hbEntry struct {
	mu      sync.Mutex       // serialises heartbeats of one record; guards the fields below
	lease   clientv3.LeaseID // 0: none yet, or lost
	ttl     int64            // granted TTL of lease, in seconds
	expires time.Time        // when the lease ends unless refreshed, by the local clock
	dropped bool             // removed from Backend.hb by sweepLocked: get a new entry
}

// entry returns the heartbeat lease entry of etcd key hbKey.
func (b *Backend) entry(hbKey string) *hbEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.hb[hbKey]
	if e == nil {
		e = &hbEntry{}
		b.hb[hbKey] = e
	}
	return e
}

// Heartbeat records that instance id is alive, under its own record for key
// that expires after ttl (rounded up to whole seconds) unless refreshed. A
// refresh with the same TTL is a keep-alive of the record's lease and, in
// parallel, a read-only transaction that checks the record is still there
// and attached to that lease: a keep-alive alone cannot tell, since a record
// deleted by hand, or overwritten and attached to another lease, leaves the
// lease alive. When the record is missing or attached to another lease, the
// refresh rewrites it (one more request, attached to the kept lease). The
// first heartbeat, a changed TTL or a lost lease costs a grant and a write.
func (b *Backend) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	if err := backend.ValidateHeartbeat(key, id, ttl); err != nil {
		return fmt.Errorf("etcdbackend: heartbeat: %w", err)
	}
	if err := checkKey(key); err != nil {
		return fmt.Errorf("etcdbackend: heartbeat: %w", err)
	}
	secs, err := ttlSeconds(ttl)
	if err != nil {
		return fmt.Errorf("etcdbackend: heartbeat: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "heartbeat")
	if err != nil {
		return err
	}
	defer cancel()
	op := fmt.Sprintf("heartbeat %q of %q", id, key)

	hbKey := b.heartbeatKey(key, id)
	var e *hbEntry
	for {
		e = b.entry(hbKey)
		e.mu.Lock()
		if !e.dropped {
			break
		}
		e.mu.Unlock()
	}
	defer e.mu.Unlock()
	start := time.Now()
	old := e.lease
	if old != 0 && e.ttl == secs {
		// A read-only transaction (no raft write) comparing the lease
		// the record is attached to; a keys-only read would not do, since
		// etcd leaves the lease out of keys-only results.
		var (
			check    *clientv3.TxnResponse
			checkErr error
			wg       sync.WaitGroup
		)
		wg.Go(func() {
			check, checkErr = b.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(hbKey), "=", old)).Commit()
		})
		_, err := b.cli.KeepAliveOnce(ctx, old)
		wg.Wait()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			old = 0 // expired, or revoked by RemoveMember: start afresh
		case err != nil:
			return fail(ctx, op, err)
		case checkErr != nil:
			return fail(ctx, op+": check record", checkErr)
		case check.Succeeded:
			e.expires = start.Add(time.Duration(e.ttl) * time.Second)
			return nil
		default:
			// The lease lives but the record is gone or attached to
			// another lease: write it again on the kept lease.
			if err := b.putHeartbeat(ctx, hbKey, id, old); err != nil {
				return fail(ctx, op, err)
			}
			e.expires = start.Add(time.Duration(e.ttl) * time.Second)
			return nil
		}
	}
	e.lease = 0

	grant, err := b.cli.Grant(ctx, secs)
	if err != nil {
		return fail(ctx, op+": grant lease", err)
	}
	if err := b.putHeartbeat(ctx, hbKey, id, grant.ID); err != nil {
		if ctx.Err() == nil {
			_, _ = b.cli.Revoke(ctx, grant.ID)
		}
		return fail(ctx, op, err)
	}
	e.lease, e.ttl = grant.ID, grant.TTL
	e.expires = start.Add(time.Duration(grant.TTL) * time.Second)
	if old != 0 {
		// The TTL changed; the old lease holds nothing any more.
		_, _ = b.cli.Revoke(ctx, old)
	}
	return nil
}

// putHeartbeat writes the heartbeat record of instance id at hbKey, attached
// to lease.
func (b *Backend) putHeartbeat(ctx context.Context, hbKey, id string, lease clientv3.LeaseID) error {
	value, err := json.Marshal(heartbeatBody{ID: id, At: time.Now()})
	if err != nil {
		return err
	}
	_, err = b.cli.Put(ctx, hbKey, string(value), clientv3.WithLease(lease))
	return err
}

// Members returns the live heartbeat records of key, sorted by ID, with
// ages and TTLs measured by etcd in whole seconds (see the package doc).
func (b *Backend) Members(ctx context.Context, key string) ([]backend.Member, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("etcdbackend: members: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "members")
	if err != nil {
		return nil, err
	}
	defer cancel()
	prefix := b.heartbeatPrefix(key)
	resp, err := b.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fail(ctx, fmt.Sprintf("members of %q", key), err)
	}
	ids := make([]clientv3.LeaseID, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		ids[i] = clientv3.LeaseID(kv.Lease)
	}
	ttls := b.lookup(ctx, ids)
	now := time.Now()
	members := make([]backend.Member, 0, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		t := ttls[i]
		if t.err != nil {
			return nil, fail(ctx, fmt.Sprintf("members of %q: look up lease", key), t.err)
		}
		if t.remaining < 0 || kv.Lease == 0 {
			continue // expired since the read
		}
		age := t.age()
		members = append(members, backend.Member{
			ID:          strings.TrimPrefix(string(kv.Key), prefix),
			HeartbeatAt: now.Add(-age),
			Age:         age,
			TTL:         time.Duration(t.remaining) * time.Second,
		})
	}
	slices.SortFunc(members, func(a, b backend.Member) int { return strings.Compare(a.ID, b.ID) })
	return members, nil
}

// RemoveMember deletes the heartbeat record of instance id for key and
// revokes its lease, so an instance that is still alive notices on its next
// Heartbeat and writes its record again. A record on a heartbeat session
// (HeartbeatBatch) is deleted and its session lease, which holds other
// records, left alone: the next batch of this Backend that refreshes it
// writes it again, that of another Backend once it looks its session's keys
// up (within the session's TTL; see HeartbeatBatch). It is not an error if
// there is none.
func (b *Backend) RemoveMember(ctx context.Context, key, id string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("etcdbackend: remove member: %w", err)
	}
	if id == "" {
		return fmt.Errorf("etcdbackend: remove member: %w: empty instance ID", backend.ErrInvalid)
	}
	ctx, cancel, err := b.begin(ctx, "remove member")
	if err != nil {
		return err
	}
	defer cancel()
	op := fmt.Sprintf("remove member %q of %q", id, key)
	resp, err := b.cli.Delete(ctx, b.heartbeatKey(key, id), clientv3.WithPrevKV())
	if err != nil {
		return fail(ctx, op, err)
	}
	for _, kv := range resp.PrevKvs {
		var body heartbeatBody
		if kv.Lease == 0 {
			continue
		}
		if json.Unmarshal(kv.Value, &body) == nil && body.Session {
			// The lease of a heartbeat session holds other records. If
			// it is one of this Backend's, its next batch writes the
			// record again should the instance still heartbeat.
			b.forgetBeat(clientv3.LeaseID(kv.Lease), string(kv.Key))
			continue
		}
		if _, err := b.cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fail(ctx, op+": revoke lease", err)
		}
	}
	return nil
}
