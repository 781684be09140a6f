package etcdbackend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

// This file implements backend.Modes: shared locks, semaphores, hierarchies
// and fair queueing. The package doc describes the key layout and the cost
// of each operation.

var _ backend.Modes = (*Backend)(nil)

// Parts of the key space of one key's entries, after "<prefix><key>\x00"
// (the release marker, which sorts before all of them).
const (
	holdersPart      = "h"   // every holder entry
	exclusiveHolders = "hx/" // Exclusive holders: hx/<token>
	sharedHolders    = "hs/" // Shared holders: hs/<limit>/<token or slot>
	intentsPart      = "i"   // every intent
	exclusiveIntents = "ix/" // intents of Exclusive locks below: ix/<token>
	sharedIntents    = "is/" // intents of Shared locks below: is/<token>
	waitersPart      = "w"   // every waiter
	exclusiveWaiters = "wx/" // waiters in Exclusive mode: wx/<wait ID>
	sharedWaiters    = "ws/" // waiters in Shared mode: ws/<wait ID>
)

// maxTxnOps is etcd's default --max-txn-ops: the most operations (at each
// level of nesting, counted along the deepest path) one transaction may
// have.
const maxTxnOps = 128

// MaxLimit is the largest Shared limit AcquireMode accepts. A limited
// Shared acquisition tries the limit's slots one after another in nested
// transactions, each level of which counts against etcd's --max-txn-ops
// (128 by default); a larger limit fails with backend.ErrUnsupported.
const MaxLimit = 64

// ModeSupport reports that the backend supports every part of
// backend.Modes: Shared locks with and without a limit (at most MaxLimit),
// hierarchies, fair queueing and writer preference.
func (b *Backend) ModeSupport() backend.ModeSupport {
	return backend.ModeSupport{Shared: true, Hierarchical: true, Fair: true, WriterFirst: true}
}

// entryBase is the etcd key every entry key of key starts with; alone, it is
// the release marker.
func (b *Backend) entryBase(key string) string { return b.prefix + key + "\x00" }

// stateEnd is the end of the range holding everything of key but its
// heartbeats: the lease record, the release marker and every entry.
func (b *Backend) stateEnd(key string) string { return b.prefix + key + "\x01" }

// limitPart encodes a Shared limit in a holder key, in fixed width so that
// the holders of one limit form one range.
func limitPart(limit int) string { return fmt.Sprintf("%08x", limit) }

// entryToken returns the token of an entry granted etcd lease id at
// acquiredAt; slot is the slot of a limited Shared holder, or -1.
func entryToken(id clientv3.LeaseID, acquiredAt time.Time, slot int) string {
	t := newToken(id, acquiredAt)
	if slot >= 0 {
		t += "-" + limitPart(slot)
	}
	return t
}

// tokenSlot returns the slot encoded in the token of a limited Shared
// holder.
func tokenSlot(token string) (int, bool) {
	i := strings.LastIndexByte(token, '-')
	if i < 0 || len(token)-i-1 != 8 {
		return 0, false
	}
	n, err := strconv.ParseUint(token[i+1:], 16, 32)
	if err != nil {
		return 0, false
	}
	return int(n), true
}

// holderKey is the etcd key of the holder entry with the given mode, limit
// and token (a slot of a limited Shared holder comes from its token).
func (b *Backend) holderKey(key string, mode backend.Mode, limit int, token string) (string, error) {
	base := b.entryBase(key)
	switch {
	case mode == backend.Exclusive:
		return base + exclusiveHolders + token, nil
	case limit == 0:
		return base + sharedHolders + limitPart(0) + "/" + token, nil
	default:
		slot, ok := tokenSlot(token)
		if !ok || slot >= limit {
			return "", errors.New("token names no slot")
		}
		return base + sharedHolders + limitPart(limit) + "/" + limitPart(slot), nil
	}
}

// slotKey is the etcd key of slot i of key's Shared holders with limit.
func (b *Backend) slotKey(key string, limit, i int) string {
	return b.entryBase(key) + sharedHolders + limitPart(limit) + "/" + limitPart(i)
}

// intentKey is the etcd key of the intent that the lock with token, in
// mode, takes on its ancestor.
func (b *Backend) intentKey(ancestor string, mode backend.Mode, token string) string {
	if mode == backend.Exclusive {
		return b.entryBase(ancestor) + exclusiveIntents + token
	}
	return b.entryBase(ancestor) + sharedIntents + token
}

// waiterKey is the etcd key of waiter waitID of key in mode.
func (b *Backend) waiterKey(key string, mode backend.Mode, waitID string) string {
	if mode == backend.Exclusive {
		return b.entryBase(key) + exclusiveWaiters + waitID
	}
	return b.entryBase(key) + sharedWaiters + waitID
}

// none is the comparison that holds while no key lies in [key, end).
func none(key, end string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(key), "=", 0).WithRange(end)
}

// noneWithPrefix is the comparison that holds while no key starts with p.
func noneWithPrefix(p string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(p), "=", 0).WithPrefix()
}

// waitState is what the backend remembers of a registration it made, so
// that a retry keeps its place in line (rev) and refreshes it with a
// keep-alive of its etcd lease instead of a new grant.
type waitState struct {
	rev     int64            // create revision of the waiter key
	mode    backend.Mode     // the mode of the waiter key
	lease   clientv3.LeaseID // the etcd lease the waiter key is attached to
	secs    int64            // the TTL it was asked for, in whole seconds
	expires time.Time        // when it ends unless refreshed, by the local clock
}

// waitMapKey returns the key of waiter waitID of key in Backend.waits.
func waitMapKey(key, waitID string) string { return key + "\x00" + waitID }

// waitStateOf returns the registration waitID of key as this Backend
// remembers it (the zero waitState if it does not).
func (b *Backend) waitStateOf(key, waitID string) waitState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waits[waitMapKey(key, waitID)]
}

// setWaitState remembers registration waitID of key as w.
func (b *Backend) setWaitState(key, waitID string, w waitState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waits[waitMapKey(key, waitID)] = w
}

// forgetWait forgets registration waitID of key.
func (b *Backend) forgetWait(key, waitID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.waits, waitMapKey(key, waitID))
}

// checkModeRequest validates req for AcquireMode.
func (b *Backend) checkModeRequest(req backend.ModeRequest) (int64, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	if err := b.ModeSupport().Check(req); err != nil {
		return 0, err
	}
	if err := checkKey(req.Key); err != nil {
		return 0, err
	}
	for _, a := range req.Ancestors {
		if err := checkKey(a); err != nil {
			return 0, fmt.Errorf("ancestor: %w", err)
		}
	}
	if req.Limit > MaxLimit {
		return 0, fmt.Errorf("%w: limit %d above etcdbackend's maximum of %d", backend.ErrUnsupported, req.Limit, MaxLimit)
	}
	if strings.ContainsRune(req.WaitID, 0) {
		return 0, fmt.Errorf("%w: wait ID %q contains a NUL byte", backend.ErrInvalid, req.WaitID)
	}
	if n := txnOps(req); n > maxTxnOps {
		return 0, fmt.Errorf("%w: %d ancestors with limit %d need %d operations in one transaction, above etcd's default --max-txn-ops of %d",
			backend.ErrUnsupported, len(req.Ancestors), req.Limit, n, maxTxnOps)
	}
	return ttlSeconds(req.TTL)
}

// txnOps returns how many operations etcd counts in the transaction of
// req (see buildAcquire): the largest list (comparisons, success or
// failure operations) of each transaction, summed along the deepest path
// of nested ones, as etcd's checkTxnRequest does.
func txnOps(req backend.ModeRequest) int {
	anc := len(req.Ancestors)
	exclusive := req.Mode == backend.Exclusive
	register := req.WaitID != "" && (exclusive || req.Fair)
	cmps := 1 + 2*anc // lease records of the key and the ancestors, their Exclusive holders
	if exclusive {
		cmps += 2 + anc // holders, intents; the ancestors' Shared holders
	} else {
		cmps += 4 // Exclusive holders, Exclusive intents, 2 for the limit
	}
	switch {
	case req.Fair:
		cmps += 2
	case !exclusive:
		cmps++
	}
	fail := 1 + anc // reads
	regNeed := 0    // the nested transaction registering a Shared waiter
	if register {
		fail++
		if !exclusive {
			regNeed = 2
		}
	}
	ops := 1 + anc // the holder and its intents
	if req.WaitID != "" {
		ops++
	}
	if exclusive || req.Limit == 0 {
		return max(cmps, ops, fail) + regNeed
	}
	// The slot chain: its last level, then one per level above it.
	need := max(1, fail) + max(ops, regNeed) + req.Limit - 1
	return max(cmps, fail) + max(need, regNeed)
}

// AcquireMode acquires req.Key in req.Mode, with intents on req.Ancestors,
// in one etcd transaction whose comparisons encode every conflict of the
// Modes contract. The entry gets its own etcd lease; a caller already
// registered as a waiter by this Backend reuses its registration's lease
// (refreshed by a keep-alive) instead of a new grant. On a conflict it
// returns a *backend.HeldError listing the conflicting holders (with their
// remaining TTLs, looked up in parallel) and, when req.WaitID is set and
// the request is Exclusive or Fair, registers the waiter in the same
// transaction.
func (b *Backend) AcquireMode(ctx context.Context, req backend.ModeRequest) (backend.Lease, error) {
	secs, err := b.checkModeRequest(req)
	if err != nil {
		return backend.Lease{}, fmt.Errorf("etcdbackend: acquire mode: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "acquire mode")
	if err != nil {
		return backend.Lease{}, err
	}
	defer cancel()
	op := fmt.Sprintf("acquire %q (%v)", req.Key, req.Mode)
	var w waitState
	if req.WaitID != "" {
		w = b.waitStateOf(req.Key, req.WaitID)
		if w.lease != 0 && w.mode != req.Mode {
			// A registration in the other mode: not this request's
			// place, and not reused; it is revoked once replaced.
			w.rev, w.secs = 0, 0
		}
	}

	// The etcd lease of the entry: the registration's, refreshed, or a
	// new one.
	var (
		id      clientv3.LeaseID
		granted int64
		fresh   bool
	)
	if w.lease != 0 && w.secs == secs {
		ttl, err := b.keepAliveOnce(ctx, w.lease)
		switch {
		case err == nil:
			id, granted = w.lease, ttl
			w.expires = time.Now().Add(time.Duration(ttl) * time.Second)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// The registration expired: it has no place in line any more.
			b.forgetWait(req.Key, req.WaitID)
			w = waitState{}
		default:
			return backend.Lease{}, fail(ctx, op+": keep-alive", err)
		}
	}
	register := req.WaitID != "" && (req.Mode == backend.Exclusive || req.Fair)
	if id != 0 {
		b.setWaitState(req.Key, req.WaitID, w)
	}
	if b.seenHeld(req.Key) && (!register || id != 0) {
		// The last attempt here found the key held, and no watch here has
		// seen a holder go since: a read-only probe with the same
		// comparisons answers without a grant, a revocation or a write
		// (no raft proposal), as long as there is nothing to register
		// (none asked, or the registration, just refreshed, is there).
		cmps, _ := b.conflictCmps(req, w)
		resp, err := b.cli.Txn(ctx).If(cmps...).Else(b.stateReads(req)...).Commit()
		if err != nil {
			return backend.Lease{}, fail(ctx, op+": probe", err)
		}
		if !resp.Succeeded && (!register || b.stillRegistered(req, id, resp.Responses[0].GetResponseRange().Kvs)) {
			return backend.Lease{}, b.modeConflict(ctx, op, req, false, id, granted, false, w, resp.Responses, resp.Header.Revision)
		}
	}
	if id == 0 {
		grant, err := b.cli.Grant(ctx, secs)
		if err != nil {
			return backend.Lease{}, fail(ctx, op+": grant lease", err)
		}
		id, granted, fresh = grant.ID, grant.TTL, true
	}

	for attempt := 0; ; attempt++ {
		lease, err := b.acquireOnce(ctx, op, req, register, id, granted, fresh, w)
		var pos *staleWait
		if attempt > 0 || !errors.As(err, &pos) {
			return lease, err
		}
		// A Fair retry of a registration this Backend did not know of
		// (made by another Backend, or forgotten): the failed
		// transaction found nothing ahead of it and told its place in
		// line, so it tries once more with it.
		w, fresh = pos.w, false
	}
}

// stillRegistered reports whether kvs, a read of req.Key's state, hold
// req's registration attached to etcd lease id.
func (b *Backend) stillRegistered(req backend.ModeRequest, id clientv3.LeaseID, kvs []*mvccpb.KeyValue) bool {
	wkey := b.waiterKey(req.Key, req.Mode, req.WaitID)
	for _, kv := range kvs {
		if string(kv.Key) == wkey {
			return clientv3.LeaseID(kv.Lease) == id
		}
	}
	return false
}

// staleWait is the error of an acquisition that failed only because the
// Backend did not know its registration's place in line; w is the
// registration now.
type staleWait struct{ w waitState }

func (e *staleWait) Error() string { return "etcdbackend: registration not known here" }

// acquireOnce runs the transaction of AcquireMode with etcd lease id
// (fresh: granted for this call), and w, the registration as this Backend
// knows it.
func (b *Backend) acquireOnce(ctx context.Context, op string, req backend.ModeRequest, register bool, id clientv3.LeaseID,
	granted int64, fresh bool, w waitState) (backend.Lease, error) {
	t, err := b.buildAcquire(req, id, w)
	if err != nil {
		if fresh {
			_, _ = b.cli.Revoke(ctx, id)
		}
		return backend.Lease{}, fmt.Errorf("etcdbackend: %s: %w", op, err)
	}
	resp, err := b.cli.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.fail...).Commit()
	if err != nil {
		// The outcome is unknown: the lease may hold the key. Revoking it
		// frees the key (and drops a registration attached to it: the
		// caller registers again).
		if ctx.Err() == nil {
			_, _ = b.cli.Revoke(ctx, id)
		}
		if req.WaitID != "" {
			b.forgetWait(req.Key, req.WaitID)
		}
		return backend.Lease{}, fail(ctx, op, err)
	}

	failed := resp.Responses
	slot := -1
	if resp.Succeeded {
		failed = nil
		if t.slots > 0 {
			// Walk the chain of slot transactions to the one that won.
			r := resp.Responses[0].GetResponseTxn()
			for i := 0; ; i++ {
				if r.Succeeded {
					slot = i
					break
				}
				if i == t.slots-1 {
					failed = r.Responses
					break
				}
				r = r.Responses[0].GetResponseTxn()
			}
		}
	}
	if failed == nil {
		token := t.token
		if slot >= 0 {
			token = t.slotTokens[slot]
		}
		if req.WaitID != "" {
			b.forgetWait(req.Key, req.WaitID)
			if w.lease != 0 && w.lease != id && ctx.Err() == nil {
				_, _ = b.cli.Revoke(ctx, w.lease) // held only the registration
			}
		}
		b.setSeenHeld(req.Key, false)
		return backend.Lease{
			Key:      req.Key,
			HolderID: req.HolderID,
			Token:    token,
			// The transaction's writes are at this revision, the holder
			// key's create revision.
			Term: uint64(resp.Header.Revision),
			TTL:  time.Duration(granted) * time.Second,
			Entry: &backend.Entry{
				Mode:      req.Mode,
				Limit:     req.Limit,
				Ancestors: slices.Clone(req.Ancestors),
			},
		}, nil
	}
	return backend.Lease{}, b.modeConflict(ctx, op, req, register, id, granted, fresh, w, failed, resp.Header.Revision)
}

// acquireTxn is the transaction of one AcquireMode.
type acquireTxn struct {
	cmps       []clientv3.Cmp
	then, fail []clientv3.Op
	token      string   // the entry's token (not limited Shared)
	slots      int      // limited Shared: the number of slot transactions
	slotTokens []string // limited Shared: the token of each slot
}

// buildAcquire builds the transaction of req with etcd lease id; w is the
// request's registration as this Backend remembers it.
func (b *Backend) buildAcquire(req backend.ModeRequest, id clientv3.LeaseID, w waitState) (acquireTxn, error) {
	var t acquireTxn
	key := req.Key
	exclusive := req.Mode == backend.Exclusive
	register := req.WaitID != "" && (exclusive || req.Fair)
	wkey := ""
	if req.WaitID != "" {
		wkey = b.waiterKey(key, req.Mode, req.WaitID)
	}
	var mismatch []clientv3.Cmp
	t.cmps, mismatch = b.conflictCmps(req, w)
	t.fail = b.stateReads(req)
	if register {
		wv := strconv.Quote(req.HolderID)
		put := clientv3.OpPut(wkey, wv, clientv3.WithLease(id))
		if exclusive {
			t.fail = append(t.fail, put)
		} else {
			// Nothing is written on a limit mismatch.
			t.fail = append(t.fail, clientv3.OpTxn(mismatch, []clientv3.Op{put}, nil))
		}
	}
	return b.buildSuccess(t, req, id, wkey)
}

// stateReads returns the reads of the failure branch of req's transaction:
// the key's whole state, and each ancestor's lease record and holders.
func (b *Backend) stateReads(req backend.ModeRequest) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(b.leaseKey(req.Key), clientv3.WithRange(b.stateEnd(req.Key)))}
	for _, a := range req.Ancestors {
		ops = append(ops, clientv3.OpGet(b.leaseKey(a), clientv3.WithRange(b.entryBase(a)+intentsPart)))
	}
	return ops
}

// conflictCmps returns the comparisons under which req succeeds, w being
// its registration as this Backend knows it, and among them (for Shared)
// those that no Shared holder has another limit.
func (b *Backend) conflictCmps(req backend.ModeRequest, w waitState) (cmps, mismatch []clientv3.Cmp) {
	key := req.Key
	base := b.entryBase(key)
	exclusive := req.Mode == backend.Exclusive

	// The conflicts on the key itself.
	cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(b.leaseKey(key)), "=", 0))
	if exclusive {
		cmps = append(cmps,
			noneWithPrefix(base+holdersPart),
			noneWithPrefix(base+intentsPart))
	} else {
		lp := base + sharedHolders + limitPart(req.Limit) + "/"
		mismatch = []clientv3.Cmp{
			none(base+sharedHolders, lp),
			none(clientv3.GetPrefixRangeEnd(lp), clientv3.GetPrefixRangeEnd(base+sharedHolders)),
		}
		cmps = append(cmps,
			noneWithPrefix(base+exclusiveHolders),
			noneWithPrefix(base+exclusiveIntents))
		cmps = append(cmps, mismatch...)
	}
	// Waiters: fair order, or writer preference.
	switch {
	case req.Fair && w.rev > 0:
		wkey := b.waiterKey(key, req.Mode, req.WaitID)
		// Still registered at w.rev, and nobody registered before.
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(wkey), "=", w.rev),
			clientv3.Compare(clientv3.CreateRevision(base+waitersPart), ">", w.rev-1).WithPrefix())
	case req.Fair:
		cmps = append(cmps, noneWithPrefix(base+waitersPart))
	case !exclusive:
		cmps = append(cmps, noneWithPrefix(base+exclusiveWaiters))
	}
	// The ancestors: no Exclusive holder, and for an Exclusive lock no
	// Shared one either.
	for _, a := range req.Ancestors {
		ab := b.entryBase(a)
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(b.leaseKey(a)), "=", 0),
			noneWithPrefix(ab+exclusiveHolders))
		if exclusive {
			cmps = append(cmps, noneWithPrefix(ab+sharedHolders))
		}
	}

	return cmps, mismatch
}

// buildSuccess adds to t what a successful acquisition of req with etcd
// lease id writes (deleting the registration wkey, if any).
func (b *Backend) buildSuccess(t acquireTxn, req backend.ModeRequest, id clientv3.LeaseID, wkey string) (acquireTxn, error) {
	key := req.Key
	exclusive := req.Mode == backend.Exclusive
	now := time.Now()
	success := func(hk, token string) ([]clientv3.Op, error) {
		body := recordBody{AcquiredAt: now, Metadata: req.Metadata, Mode: req.Mode, Limit: req.Limit}
		value, err := encodeRecord(token, req.HolderID, body)
		if err != nil {
			return nil, fmt.Errorf("encode record: %w", err)
		}
		ops := []clientv3.Op{clientv3.OpPut(hk, value, clientv3.WithLease(id))}
		body.Key = key
		iv, err := encodeRecord(token, req.HolderID, body)
		if err != nil {
			return nil, fmt.Errorf("encode intent: %w", err)
		}
		for _, a := range req.Ancestors {
			ops = append(ops, clientv3.OpPut(b.intentKey(a, req.Mode, token), iv, clientv3.WithLease(id)))
		}
		if wkey != "" {
			ops = append(ops, clientv3.OpDelete(wkey))
		}
		return ops, nil
	}
	if exclusive || req.Limit == 0 {
		t.token = entryToken(id, now, -1)
		hk, err := b.holderKey(key, req.Mode, req.Limit, t.token)
		if err != nil {
			return t, err
		}
		t.then, err = success(hk, t.token)
		return t, err
	}

	// A limited Shared acquisition takes the first free slot: a chain of
	// nested transactions, level i trying slot i, whose last failure
	// branch is the failed acquisition's.
	t.slots = req.Limit
	t.slotTokens = make([]string, req.Limit)
	next := t.fail
	for i := req.Limit - 1; i >= 0; i-- {
		t.slotTokens[i] = entryToken(id, now, i)
		ops, err := success(b.slotKey(key, req.Limit, i), t.slotTokens[i])
		if err != nil {
			return t, err
		}
		level := clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(b.slotKey(key, req.Limit, i)), "=", 0)},
			[]clientv3.Op{clientv3.OpTxn(nil, ops, nil)},
			next)
		next = []clientv3.Op{level}
	}
	t.then = next
	return t, nil
}

// keyState is a read of one key's range (lease record, marker, entries),
// split by kind.
type keyState struct {
	plain   *mvccpb.KeyValue
	holders []*mvccpb.KeyValue // hx and hs
	intents []*mvccpb.KeyValue // ix and is
	waiters []*mvccpb.KeyValue // wx and ws
}

// splitState sorts kvs, read from key's range, by kind.
func (b *Backend) splitState(key string, kvs []*mvccpb.KeyValue) keyState {
	var s keyState
	lk, base := b.leaseKey(key), b.entryBase(key)
	for _, kv := range kvs {
		k := string(kv.Key)
		switch {
		case k == lk:
			s.plain = kv
		case !strings.HasPrefix(k, base) || len(k) == len(base):
			// The release marker, or not of this key.
		case k[len(base)] == holdersPart[0]:
			s.holders = append(s.holders, kv)
		case k[len(base)] == intentsPart[0]:
			s.intents = append(s.intents, kv)
		case k[len(base)] == waitersPart[0]:
			s.waiters = append(s.waiters, kv)
		}
	}
	return s
}

// entryKind returns the part of an entry's etcd key after its base ("hx/",
// "hs/", ...).
func (b *Backend) entryKind(key string, kv *mvccpb.KeyValue) string {
	k := string(kv.Key)[len(b.entryBase(key)):]
	if len(k) < 3 {
		return k
	}
	return k[:3]
}

// parseEntry decodes the holder or intent entry kv of key: the record of
// the lock it belongs to (for an intent, that lock's key), without its TTL,
// and its etcd lease.
func parseEntry(key string, kv *mvccpb.KeyValue) (backend.Record, clientv3.LeaseID, error) {
	rec, lease, err := parseRecord(key, kv)
	if err != nil {
		return rec, lease, err
	}
	_, _, body, _ := decodeRecord(kv.Value)
	if body.Key != "" {
		rec.Key = body.Key
	}
	rec.Mode, rec.Limit = body.Mode, body.Limit
	return rec, lease, nil
}

// modeConflict turns the failure branch of an AcquireMode (reads of the
// key and its ancestors, and the registration) into an error: a
// *backend.HeldError, or one wrapping backend.ErrLimitMismatch. It records
// the registration and frees the etcd leases nothing holds any more.
func (b *Backend) modeConflict(ctx context.Context, op string, req backend.ModeRequest, register bool, id clientv3.LeaseID,
	granted int64, fresh bool, w waitState, rs []*etcdserverpb.ResponseOp, rev int64) error {
	exclusive := req.Mode == backend.Exclusive
	st := b.splitState(req.Key, rs[0].GetResponseRange().Kvs)
	ancs := make([]keyState, len(req.Ancestors))
	for i, a := range req.Ancestors {
		ancs[i] = b.splitState(a, rs[1+i].GetResponseRange().Kvs)
	}
	registered := false
	if register {
		last := rs[len(rs)-1]
		if tx := last.GetResponseTxn(); tx != nil {
			registered = tx.Succeeded
		} else {
			registered = last.GetResponsePut() != nil
		}
	}

	// The registration: its place in line and its lease.
	wkey := ""
	var before *mvccpb.KeyValue // the registration as it was before
	if req.WaitID != "" {
		wkey = b.waiterKey(req.Key, req.Mode, req.WaitID)
		for _, kv := range st.waiters {
			if string(kv.Key) == wkey {
				before = kv
			}
		}
	}
	var revoke []clientv3.LeaseID
	myRev := int64(0)
	switch {
	case registered:
		myRev = rev
		if before != nil {
			myRev = before.CreateRevision
			if before.Lease != 0 && clientv3.LeaseID(before.Lease) != id {
				revoke = append(revoke, clientv3.LeaseID(before.Lease))
			}
		}
		if w.lease != 0 && w.lease != id && !slices.Contains(revoke, w.lease) {
			revoke = append(revoke, w.lease)
		}
		secs, _ := ttlSeconds(req.TTL)
		b.setWaitState(req.Key, req.WaitID, waitState{
			rev:     myRev,
			mode:    req.Mode,
			lease:   id,
			secs:    secs,
			expires: time.Now().Add(time.Duration(granted) * time.Second),
		})
	case fresh:
		revoke = append(revoke, id) // holds nothing
	}
	if myRev == 0 && before != nil {
		myRev = before.CreateRevision // registered before this attempt
	}

	// A Shared holder with another limit: nothing was written.
	if !exclusive {
		for _, kv := range st.holders {
			if b.entryKind(req.Key, kv) != sharedHolders {
				continue
			}
			if _, _, body, err := decodeRecord(kv.Value); err == nil && body.Limit != req.Limit {
				if _, err := b.entryRecords(ctx, nil, nil, revoke); err != nil {
					return fail(ctx, op, err)
				}
				return fmt.Errorf("etcdbackend: %s: limit %d, live shared holders agreed on %d: %w",
					op, req.Limit, body.Limit, backend.ErrLimitMismatch)
			}
		}
	}

	// The conflicting entries.
	var conflicts []*mvccpb.KeyValue
	var owners []string // the key each conflicting kv was read under
	add := func(k string, kv *mvccpb.KeyValue) {
		conflicts = append(conflicts, kv)
		owners = append(owners, k)
	}
	if st.plain != nil {
		add(req.Key, st.plain)
	}
	shared := 0
	for _, kv := range st.holders {
		switch kind := b.entryKind(req.Key, kv); {
		case exclusive || kind == exclusiveHolders:
			add(req.Key, kv)
		default:
			shared++
		}
	}
	if !exclusive && req.Limit > 0 && shared >= req.Limit {
		for _, kv := range st.holders {
			if b.entryKind(req.Key, kv) == sharedHolders {
				add(req.Key, kv)
			}
		}
	}
	for _, kv := range st.intents {
		if exclusive || b.entryKind(req.Key, kv) == exclusiveIntents {
			add(req.Key, kv)
		}
	}
	for i, a := range req.Ancestors {
		if ancs[i].plain != nil {
			add(a, ancs[i].plain)
		}
		for _, kv := range ancs[i].holders {
			if exclusive || b.entryKind(a, kv) == exclusiveHolders {
				add(a, kv)
			}
		}
	}

	// The waiters it had to yield to.
	waiting := 0
	switch {
	case req.Fair:
		for _, kv := range st.waiters {
			// Not counting this request's own registration, nor one it
			// replaced (in the other mode), being revoked.
			if string(kv.Key) != wkey && (myRev == 0 || kv.CreateRevision < myRev) &&
				!slices.Contains(revoke, clientv3.LeaseID(kv.Lease)) {
				waiting++
			}
		}
	case !exclusive:
		for _, kv := range st.waiters {
			if b.entryKind(req.Key, kv) == exclusiveWaiters {
				waiting++
			}
		}
	}

	if req.Fair && registered && len(conflicts) == 0 && waiting == 0 && w.rev != myRev {
		if _, err := b.entryRecords(ctx, nil, nil, revoke); err != nil {
			return fail(ctx, op, err)
		}
		return &staleWait{w: b.waitStateOf(req.Key, req.WaitID)}
	}
	recs, err := b.entryRecords(ctx, owners, conflicts, revoke)
	if err != nil {
		return fail(ctx, op, err)
	}
	b.setSeenHeld(req.Key, true)
	held := &backend.HeldError{Holders: recs, Waiting: waiting}
	switch {
	case len(recs) > 0:
		held.Holder = recs[0]
	default:
		held.Holder = backend.Record{Key: req.Key}
		var all []*mvccpb.KeyValue
		if st.plain != nil {
			all = append(all, st.plain)
		}
		all = append(all, st.holders...)
		if len(all) > 0 {
			slices.SortFunc(all, func(x, y *mvccpb.KeyValue) int { return cmp.Compare(x.CreateRevision, y.CreateRevision) })
			if r, err := b.entryRecords(ctx, []string{req.Key}, all[:1], nil); err == nil && len(r) == 1 {
				held.Holder = r[0]
			}
		}
	}
	return held
}

// entryRecords returns the records of the lease records and entries kvs,
// each read under the key in owners, in term order, with their remaining
// TTLs looked up in parallel while the leases in revoke are revoked (a
// failed revocation is ignored: such a lease holds nothing and expires on
// its own). A record whose lease has gone since the read is returned as
// read, with no TTL left.
func (b *Backend) entryRecords(ctx context.Context, owners []string, kvs []*mvccpb.KeyValue, revoke []clientv3.LeaseID) ([]backend.Record, error) {
	recs := make([]backend.Record, 0, len(kvs))
	ids := make([]clientv3.LeaseID, 0, len(kvs)+len(revoke))
	for i, kv := range kvs {
		rec, lease, err := parseEntry(owners[i], kv)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
		ids = append(ids, lease)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, id := range revoke {
			if ctx.Err() == nil {
				_, _ = b.cli.Revoke(ctx, id)
			}
		}
	}()
	ttls := b.lookup(ctx, ids)
	<-done
	now := time.Now()
	for i := range recs {
		rec, err := completeRecord(recs[i], ttls[i], nil, now)
		if err != nil && !errors.Is(err, errLeaseGone) {
			return nil, err
		}
		recs[i] = rec
	}
	slices.SortStableFunc(recs, func(x, y backend.Record) int { return cmp.Compare(x.Term, y.Term) })
	return recs, nil
}

// Holders returns the record of every live holder of key (its lease from
// Acquire, or its entries), in term order: one range read of the key's
// record and holder entries, then a look-up of each holder's etcd lease,
// in parallel. The records carry Mode and Limit, and no heartbeat fields
// (Get has them).
func (b *Backend) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("etcdbackend: holders: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "holders")
	if err != nil {
		return nil, err
	}
	defer cancel()
	op := fmt.Sprintf("holders of %q", key)
	resp, err := b.cli.Get(ctx, b.leaseKey(key), clientv3.WithRange(b.entryBase(key)+intentsPart))
	if err != nil {
		return nil, fail(ctx, op, err)
	}
	st := b.splitState(key, resp.Kvs)
	return b.liveRecords(ctx, op, key, st)
}

// liveRecords returns the records of the holders in st, in term order,
// leaving out those whose lease has gone since the read.
func (b *Backend) liveRecords(ctx context.Context, op, key string, st keyState) ([]backend.Record, error) {
	var kvs []*mvccpb.KeyValue
	if st.plain != nil {
		kvs = append(kvs, st.plain)
	}
	kvs = append(kvs, st.holders...)
	recs := make([]backend.Record, 0, len(kvs))
	ids := make([]clientv3.LeaseID, 0, len(kvs))
	for _, kv := range kvs {
		rec, lease, err := parseEntry(key, kv)
		if err != nil {
			return nil, fail(ctx, op, err)
		}
		recs = append(recs, rec)
		ids = append(ids, lease)
	}
	ttls := b.lookup(ctx, ids)
	now := time.Now()
	out := make([]backend.Record, 0, len(recs))
	for i, rec := range recs {
		rec, err := completeRecord(rec, ttls[i], nil, now)
		if errors.Is(err, errLeaseGone) {
			continue
		}
		if err != nil {
			return nil, fail(ctx, op, err)
		}
		out = append(out, rec)
	}
	slices.SortStableFunc(out, func(x, y backend.Record) int { return cmp.Compare(x.Term, y.Term) })
	return out, nil
}

// CancelWait withdraws the registration waitID of key. When this Backend
// made the registration, it revokes the registration's etcd lease, which
// deletes it (one request); otherwise it deletes the waiter keys and then
// revokes the lease they were attached to (two). Watchers of the key see
// backend.EventChanged, so that the waiters behind it look again.
func (b *Backend) CancelWait(ctx context.Context, key, waitID string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("etcdbackend: cancel wait: %w", err)
	}
	if waitID == "" {
		return fmt.Errorf("etcdbackend: cancel wait: %w: empty wait ID", backend.ErrInvalid)
	}
	ctx, cancel, err := b.begin(ctx, "cancel wait")
	if err != nil {
		return err
	}
	defer cancel()
	op := fmt.Sprintf("cancel wait %q of %q", waitID, key)
	if w := b.waitStateOf(key, waitID); w.lease != 0 {
		_, err := b.cli.Revoke(ctx, w.lease)
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fail(ctx, op, err)
		}
		b.forgetWait(key, waitID)
		return nil
	}
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpDelete(b.waiterKey(key, backend.Exclusive, waitID), clientv3.WithPrevKV()),
		clientv3.OpDelete(b.waiterKey(key, backend.Shared, waitID), clientv3.WithPrevKV()),
	).Commit()
	if err != nil {
		return fail(ctx, op, err)
	}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseDeleteRange().PrevKvs {
			if kv.Lease == 0 {
				continue
			}
			// The lease held only this registration.
			if _, err := b.cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return fail(ctx, op+": revoke lease", err)
			}
		}
	}
	return nil
}

// entryOwnerCheck returns the comparisons that hold only while the store
// holds exactly the entry l (see ownerCheck), and the entry's holder key.
// With intents, they also hold only while each of its intents is there,
// created with the entry: an entry that lost one (deleted by hand) no
// longer protects its tree, so it counts as lost.
func (b *Backend) entryOwnerCheck(l backend.Lease, id clientv3.LeaseID, intents bool) ([]clientv3.Cmp, string, error) {
	hk, err := b.holderKey(l.Key, l.Entry.Mode, l.Entry.Limit, l.Token)
	if err != nil {
		return nil, "", err
	}
	cmps := ownerCmps(hk, l, id)
	if intents {
		for _, a := range l.Entry.Ancestors {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(b.intentKey(a, l.Entry.Mode, l.Token)), "=", int64(l.Term)))
		}
	}
	return cmps, hk, nil
}

// renewEntry is Renew of an entry: an owner-checked read-only transaction,
// then a keep-alive of the entry's etcd lease, which its intents share.
func (b *Backend) renewEntry(ctx context.Context, l backend.Lease, id clientv3.LeaseID) error {
	cmps, _, err := b.entryOwnerCheck(l, id, true)
	if err != nil {
		return fmt.Errorf("etcdbackend: renew %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Commit()
	if err != nil {
		return fail(ctx, fmt.Sprintf("renew %q", l.Key), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: renew %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
	}
	if _, err := b.keepAliveOnce(ctx, id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("etcdbackend: renew %q term %d (%v): lease expired: %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
		}
		return fail(ctx, fmt.Sprintf("renew %q: keep-alive", l.Key), err)
	}
	return nil
}

// releaseEntry is Release of an entry: one owner-checked transaction
// deletes the entry and its intents and writes the release marker of the
// key and of each ancestor (so their watchers see backend.EventReleased),
// then the entry's etcd lease, which holds only the markers now, is
// revoked.
func (b *Backend) releaseEntry(ctx context.Context, l backend.Lease, id clientv3.LeaseID) error {
	// Release deletes whatever of the entry is left.
	cmps, hk, err := b.entryOwnerCheck(l, id, false)
	if err != nil {
		return fmt.Errorf("etcdbackend: release %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	ops := []clientv3.Op{
		clientv3.OpDelete(hk),
		clientv3.OpPut(b.releaseMarker(l.Key), "released", clientv3.WithLease(id)),
	}
	for _, a := range l.Entry.Ancestors {
		ops = append(ops,
			clientv3.OpDelete(b.intentKey(a, l.Entry.Mode, l.Token)),
			clientv3.OpPut(b.releaseMarker(a), "released", clientv3.WithLease(id)))
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return fail(ctx, fmt.Sprintf("release %q", l.Key), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: release %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
	}
	if ctx.Err() == nil {
		_, _ = b.cli.Revoke(ctx, id)
	}
	return nil
}

// setEntryMetadata is SetMetadata of an entry: one owner-checked
// transaction rewrites the entry and its intents (which carry the lock's
// record) with the same etcd lease.
func (b *Backend) setEntryMetadata(ctx context.Context, l backend.Lease, id clientv3.LeaseID, at time.Time, md map[string]string) error {
	cmps, hk, err := b.entryOwnerCheck(l, id, true)
	if err != nil {
		return fmt.Errorf("etcdbackend: set metadata of %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	body := recordBody{AcquiredAt: at, Metadata: md, Mode: l.Entry.Mode, Limit: l.Entry.Limit}
	value, err := encodeRecord(l.Token, l.HolderID, body)
	if err != nil {
		return fmt.Errorf("etcdbackend: set metadata of %q: encode record: %w", l.Key, err)
	}
	ops := []clientv3.Op{clientv3.OpPut(hk, value, clientv3.WithLease(id))}
	body.Key = l.Key
	iv, err := encodeRecord(l.Token, l.HolderID, body)
	if err != nil {
		return fmt.Errorf("etcdbackend: set metadata of %q: encode intent: %w", l.Key, err)
	}
	for _, a := range l.Entry.Ancestors {
		ops = append(ops, clientv3.OpPut(b.intentKey(a, l.Entry.Mode, l.Token), iv, clientv3.WithLease(id)))
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return fail(ctx, fmt.Sprintf("set metadata of %q", l.Key), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: set metadata of %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
	}
	return nil
}
