package etcdbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

var _ backend.BatchHeartbeater = (*Backend)(nil)

// hbSession is the etcd lease that the heartbeat records of one TTL,
// written by HeartbeatBatch, share.
type hbSession struct {
	mu       sync.Mutex           // serialises batches of this TTL; guards the fields below
	id       clientv3.LeaseID     // 0: none yet, or lost
	ttl      int64                // granted TTL of id, in seconds
	lastSent time.Time            // send time of the grant or last keep-alive of id that succeeded
	beats    map[string]time.Time // etcd key of each record on id → when this Backend last sent its heartbeat
}

// hbSessionFor returns the heartbeat session of TTL secs, made on demand.
func (b *Backend) hbSessionFor(secs int64) *hbSession {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.hbSessions[secs]
	if s == nil {
		s = &hbSession{beats: make(map[string]time.Time)}
		b.hbSessions[secs] = s
	}
	return s
}

// HeartbeatBatch implements backend.BatchHeartbeater: the records of one
// TTL are attached to one etcd lease of this Backend (its heartbeat session
// of that TTL), so a batch costs two requests sent together, however many
// records it refreshes: a keep-alive of the session lease and a look-up of
// the keys attached to it (no raft write). Records that are missing (deleted
// by hand or by RemoveMember, or attached to another lease) are written
// again, up to 128 per transaction; so are all of them when the session
// lease has gone (a new one is granted). A record on the session that this
// Backend has not been asked to refresh for a TTL is deleted in the same
// transaction, so records of instances that stopped heartbeating end within
// about a TTL although the session lives on; and the age a reader measures
// (Members, Record.HeartbeatAge) is the age of the session's last
// keep-alive, the last batch of this Backend.
func (b *Backend) HeartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest) []error {
	errs := make([]error, len(reqs))
	ctx, cancel, err := b.begin(ctx, "heartbeat")
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer cancel()
	byTTL := make(map[int64][]int)
	for i, r := range reqs {
		if err := backend.ValidateHeartbeat(r.Key, r.ID, r.TTL); err != nil {
			errs[i] = fmt.Errorf("etcdbackend: heartbeat: %w", err)
			continue
		}
		if err := checkKey(r.Key); err != nil {
			errs[i] = fmt.Errorf("etcdbackend: heartbeat: %w", err)
			continue
		}
		secs, err := ttlSeconds(r.TTL)
		if err != nil {
			errs[i] = fmt.Errorf("etcdbackend: heartbeat: %w", err)
			continue
		}
		byTTL[secs] = append(byTTL[secs], i)
	}
	var wg sync.WaitGroup
	for secs, items := range byTTL {
		wg.Go(func() {
			err := b.heartbeatSession(ctx, secs, reqs, items)
			if err != nil {
				for _, i := range items {
					errs[i] = fail(ctx, fmt.Sprintf("heartbeat %q of %q", reqs[i].ID, reqs[i].Key), err)
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// heartbeatSession refreshes the heartbeats reqs[i], i in items, all of TTL
// secs, on the heartbeat session of that TTL.
func (b *Backend) heartbeatSession(ctx context.Context, secs int64, reqs []backend.HeartbeatRequest, items []int) error {
	s := b.hbSessionFor(secs)
	s.mu.Lock()
	defer s.mu.Unlock()
	sent := time.Now()
	var attached map[string]bool // nil: a new session, every record is written
	if s.id != 0 && sent.Sub(s.lastSent) < time.Duration(s.ttl)*time.Second {
		var (
			ttl    *clientv3.LeaseTimeToLiveResponse
			ttlErr error
			wg     sync.WaitGroup
		)
		wg.Go(func() { ttl, ttlErr = b.cli.TimeToLive(ctx, s.id, clientv3.WithAttachedKeys()) })
		_, kaErr := b.cli.KeepAliveOnce(ctx, s.id)
		wg.Wait()
		switch {
		case errors.Is(kaErr, rpctypes.ErrLeaseNotFound):
			s.id = 0
		case kaErr != nil:
			return kaErr
		case ttlErr != nil:
			return ttlErr
		default:
			s.lastSent = sent
			attached = make(map[string]bool, len(ttl.Keys))
			for _, k := range ttl.Keys {
				attached[string(k)] = true
			}
		}
	}
	if attached == nil {
		grant, err := b.cli.Grant(ctx, secs)
		if err != nil {
			return fmt.Errorf("grant heartbeat session: %w", err)
		}
		s.id, s.ttl, s.lastSent = grant.ID, grant.TTL, sent
		clear(s.beats)
		attached = make(map[string]bool)
	}
	var ops []clientv3.Op
	for _, i := range items {
		r := reqs[i]
		k := b.heartbeatKey(r.Key, r.ID)
		s.beats[k] = sent
		if attached[k] {
			continue
		}
		value, err := json.Marshal(heartbeatBody{ID: r.ID, At: sent, Session: true})
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(k, string(value), clientv3.WithLease(s.id)))
		attached[k] = true // a key twice in one batch is written once
	}
	stale := time.Duration(s.ttl) * time.Second
	for k, at := range s.beats {
		if sent.Sub(at) < stale {
			continue
		}
		delete(s.beats, k)
		if attached[k] {
			// Deleted only while still on this session: a record
			// written since by anyone else stays.
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", s.id)},
				[]clientv3.Op{clientv3.OpDelete(k)}, nil))
		}
	}
	for len(ops) > 0 {
		n := min(len(ops), txnBatchOps)
		if _, err := b.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				s.id = 0
			}
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// txnBatchOps is the most operations one transaction of HeartbeatBatch
// carries: etcd's default --max-txn-ops.
const txnBatchOps = 128
