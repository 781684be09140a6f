package etcdbackend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// hierarchies, fair queueing, writer preference, and writer preference
// across a tree (Exclusive waiters on an ancestor block new locks below).
func (b *Backend) ModeSupport() backend.ModeSupport {
	return backend.ModeSupport{Shared: true, Hierarchical: true, Fair: true, WriterFirst: true, AncestorWaiters: true}
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

// entryToken returns the token of an entry on etcd lease id (onSession: a
// session lease) acquired at acquiredAt; slot is the slot of a limited
// Shared holder, or -1.
func entryToken(id clientv3.LeaseID, acquiredAt time.Time, slot int, onSession bool) string {
	t := newToken(id, acquiredAt)
	if onSession {
		t = newSessionToken(id, acquiredAt)
	}
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
// that a retry keeps its place in line (rev) and refreshes it without a
// write while it is still there.
type waitState struct {
	rev     int64            // create revision of the waiter key
	mode    backend.Mode     // the mode of the waiter key
	lease   clientv3.LeaseID // the session lease the waiter key is attached to
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
	// The lease records of the key and the ancestors, the ancestors'
	// holders (all for Exclusive, the Exclusive ones for Shared).
	cmps := 1 + 2*anc
	if exclusive {
		cmps += 2 // holders, intents
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
	if !req.Fair {
		cmps += anc // the ancestors' Exclusive waiters
		fail += anc // and their count
	}
	regNeed := 0 // the nested transaction registering a Shared waiter
	if register {
		if exclusive {
			fail += 2 // the other mode's key deleted, the put
		} else {
			fail++
			regNeed = 2
		}
	}
	ops := 2 + anc // the holder, its intents and the lease mark
	if req.WaitID != "" {
		ops += 2 // the registration deleted, in both modes
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
// Modes contract. Unless req.Detached, the entry and its intents are
// attached to the session lease of the request's TTL, as Acquire's keys
// are (see the package doc, "Sessions"): a success is that one transaction,
// with a keep-alive of the session sent with it when the session has less
// than the TTL left. A Detached request gets an etcd lease of its own,
// granted first. On a conflict it returns a *backend.HeldError listing the
// conflicting holders (with their remaining TTLs, looked up in parallel)
// and, when req.WaitID is set and the request is Exclusive or Fair,
// registers the waiter, on the session lease, in the same transaction.
// When etcd says the session lease is gone, a new one is granted and the
// acquisition tried again, once. With req.RegisterOnly both branches of the
// transaction register (as the failure branch does) and read the state, and
// none writes an entry: a success of its comparisons is
// backend.ErrRegisteredOnly.
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
	for attempt := 0; ; attempt++ {
		lease, err := b.acquireModeOnce(ctx, op, req, secs)
		// A Fair retry of a registration this Backend did not know of
		// (made by another Backend, or forgotten): the failed transaction
		// found nothing ahead of it and recorded its place in line, so it
		// tries once more with it. A session lease found gone: once more
		// on a new one.
		var pos *staleWait
		if attempt > 0 || ctx.Err() != nil || (!errors.As(err, &pos) && !errors.Is(err, errSessionGone)) {
			return lease, err
		}
	}
}

// errSessionGone reports that etcd no longer has the session lease an
// acquisition used.
var errSessionGone = errors.New("session lease gone")

// registration returns the record of req's registration in kvs, a read of
// req.Key's state, if it is there attached to etcd lease id (nil if not).
func (b *Backend) registration(req backend.ModeRequest, id clientv3.LeaseID, kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	wkey := b.waiterKey(req.Key, req.Mode, req.WaitID)
	for _, kv := range kvs {
		if string(kv.Key) == wkey {
			if clientv3.LeaseID(kv.Lease) == id {
				return kv
			}
			return nil
		}
	}
	return nil
}

// staleWait is the error of an acquisition that failed only because the
// Backend did not know its registration's place in line.
type staleWait struct{}

func (e *staleWait) Error() string { return "etcdbackend: registration not known here" }

// otherMode returns the mode that is not m.
func otherMode(m backend.Mode) backend.Mode {
	if m == backend.Exclusive {
		return backend.Shared
	}
	return backend.Exclusive
}

// acquireModeOnce is one attempt of AcquireMode, with the request's TTL
// in whole seconds.
func (b *Backend) acquireModeOnce(ctx context.Context, op string, req backend.ModeRequest, secs int64) (backend.Lease, error) {
	exclusive := req.Mode == backend.Exclusive
	register := req.WaitID != "" && (exclusive || req.Fair)
	onSess := !req.Detached
	sent := time.Now()

	// The session lease: the entry's (unless Detached) and the
	// registration's.
	var s sessionState
	if onSess || register {
		var err error
		if s, err = b.sessionLease(ctx, secs); err != nil {
			return backend.Lease{}, fail(ctx, op+": grant session lease", err)
		}
	}
	full := time.Duration(s.ttl) * time.Second
	left := full - sent.Sub(s.lastSent)
	// A key on the session lasts at least left after sent: when that is
	// less than the TTL asked for, a keep-alive goes with the transaction
	// (see acquireOnSession).
	needKA := s.id != 0 && left < req.TTL

	// The registration as this Backend knows it: on the current session
	// only (one on a session since lost is gone with it), and its place in
	// line only in the same mode.
	var w waitState
	if req.WaitID != "" {
		w = b.waitStateOf(req.Key, req.WaitID)
		switch {
		case w.lease == 0 || w.lease != s.id:
			w = waitState{}
		case w.mode != req.Mode:
			w.rev = 0
		}
	}
	registeredHere := register && w.lease != 0 && w.mode == req.Mode

	if b.seenHeld(req.Key) && (!register || registeredHere) {
		// The last attempt here found the key held, and no watch here has
		// seen a holder go since: a read-only probe with the same
		// comparisons answers without a write (no raft proposal), as long
		// as there is nothing to register (none asked, or the
		// registration is there: the probe refreshes it, with a
		// keep-alive of the session sent with it when needed).
		var kaWait func() error
		if needKA && registeredHere {
			kaWait = b.sessionKeepAlive(ctx, s.id)
		}
		// A withdrawal of the registration as due may delete it after
		// the probe read it: then the probe proves nothing (regQuiet).
		epoch, quiet := b.regQuiet(secs)
		cmps, _ := b.conflictCmps(req, w)
		resp, err := b.cli.Txn(ctx).If(cmps...).Else(b.stateReads(req)...).Commit()
		var kaErr error
		if kaWait != nil {
			kaErr = kaWait()
		}
		if errors.Is(kaErr, rpctypes.ErrLeaseNotFound) {
			b.sessionLost(s.id)
			return backend.Lease{}, fmt.Errorf("etcdbackend: %s: %w", op, errSessionGone)
		}
		if err != nil {
			return backend.Lease{}, fail(ctx, op+": probe", err)
		}
		if kaWait != nil && kaErr == nil {
			// Kept alive after sent: a key on it lasts its full TTL.
			needKA, left = false, full
		}
		refreshed := false
		if register && !resp.Succeeded && quiet {
			if reg := b.registration(req, s.id, resp.Responses[0].GetResponseRange().Kvs); reg != nil {
				// Its end moves only if no withdrawal began since
				// the probe was sent; otherwise it is put again
				// (below), which the withdrawal then leaves alone.
				w.expires = sent.Add(req.TTL)
				refreshed = b.noteRefresh(secs, s.id, b.waiterKey(req.Key, req.Mode, req.WaitID), req.Key, req.WaitID, w.expires, reg.ModRevision, epoch)
			}
		}
		if !resp.Succeeded && (!register || refreshed) {
			if register {
				b.setWaitState(req.Key, req.WaitID, w)
			}
			return backend.Lease{}, b.modeConflict(ctx, op, req, false, s.id, 0, w, resp.Responses, resp.Header.Revision, sent)
		}
	}

	// The entry's etcd lease: the session's, or (Detached) one of its own.
	var (
		id      clientv3.LeaseID
		granted = s.ttl
		fresh   clientv3.LeaseID // a grant of this call, revoked unless it holds the entry
	)
	if onSess || req.RegisterOnly {
		id = s.id // RegisterOnly: no entry, no lease of its own
	} else {
		grant, err := b.cli.Grant(ctx, secs)
		if err != nil {
			return backend.Lease{}, fail(ctx, op+": grant lease", err)
		}
		id, granted, fresh = grant.ID, grant.TTL, grant.ID
	}
	revokeFresh := func() {
		if fresh != 0 && ctx.Err() == nil {
			_, _ = b.cli.Revoke(ctx, fresh)
		}
	}
	t, err := b.buildAcquire(req, id, s.id, onSess, w)
	if err != nil {
		revokeFresh()
		return backend.Lease{}, fmt.Errorf("etcdbackend: %s: %w", op, err)
	}
	if !req.RegisterOnly && (fresh != 0 || (onSess && !s.marked)) {
		// The lease mark with the entry (see leaseMark).
		t.then = append(t.then, clientv3.OpPut(b.leaseMark(id), "", clientv3.WithLease(id)))
	}
	var kaWait func() error
	if needKA {
		kaWait = b.sessionKeepAlive(ctx, s.id)
	}
	if s.id != 0 {
		b.setPendingMode(req, 1)
		defer b.setPendingMode(req, -1) // after the keys are recorded
	}
	resp, err := b.cli.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.fail...).Commit()
	var kaErr error
	if kaWait != nil {
		kaErr = kaWait()
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// Nothing was written: a lease the transaction attaches keys to
		// is gone (the session's; a grant just made lives on).
		revokeFresh()
		b.sessionLost(s.id)
		return backend.Lease{}, fmt.Errorf("etcdbackend: %s: %w", op, errSessionGone)
	}
	if err != nil {
		// The outcome is unknown: the entry may be held, by nobody. A
		// grant of its own is revoked (which frees it); on the session,
		// it is deleted in the background. A registration it may have
		// made is withdrawn at its TTL unless a retry refreshes it.
		switch {
		case fresh != 0:
			revokeFresh()
		case !req.RegisterOnly:
			b.cleanUpEntries(req, id, t.tokens())
		}
		if register {
			// Its mod revision is unknown: withdrawn by its lease alone.
			b.noteRegistration(secs, s.id, b.waiterKey(req.Key, req.Mode, req.WaitID), req.Key, req.WaitID, sent.Add(req.TTL), 0)
		}
		return backend.Lease{}, fail(ctx, op, err)
	}

	if req.RegisterOnly {
		if errors.Is(kaErr, rpctypes.ErrLeaseNotFound) {
			b.sessionLost(s.id)
			return backend.Lease{}, fmt.Errorf("etcdbackend: %s: %w", op, errSessionGone)
		}
		// Either branch registered and read the state alike.
		err := b.modeConflict(ctx, op, req, register, s.id, 0, w, resp.Responses, resp.Header.Revision, sent)
		var held *backend.HeldError
		if resp.Succeeded && errors.As(err, &held) {
			b.setSeenHeld(req.Key, false)
			return backend.Lease{}, fmt.Errorf("etcdbackend: %s: %w", op, backend.ErrRegisteredOnly)
		}
		return backend.Lease{}, err
	}
	failed := resp.Responses
	token := ""
	if resp.Succeeded {
		failed = nil
		token = t.token
		if t.slots > 0 {
			// Walk the chain of slot transactions to the one that won.
			r := resp.Responses[0].GetResponseTxn()
			for i := 0; ; i++ {
				if r.Succeeded {
					token = t.slotTokens[i]
					break
				}
				if i == t.slots-1 {
					failed, token = r.Responses, ""
					break
				}
				r = r.Responses[0].GetResponseTxn()
			}
		}
	}
	if errors.Is(kaErr, rpctypes.ErrLeaseNotFound) {
		b.sessionLost(s.id)
		if token == "" || onSess {
			// What the transaction put on the session went with it.
			revokeFresh()
			return backend.Lease{}, fmt.Errorf("etcdbackend: %s: %w", op, errSessionGone)
		}
	}
	if token == "" {
		return backend.Lease{}, b.modeConflict(ctx, op, req, register, s.id, fresh, w, failed, resp.Header.Revision, sent)
	}

	ttl := time.Duration(granted) * time.Second
	if onSess {
		switch {
		case kaWait != nil && kaErr == nil:
		case kaWait == nil:
			// The entry ends when the session does, at least left after
			// sent, which is at least req.TTL.
			ttl = min(ttl, left)
		default:
			// The entry may end before req.TTL has passed since sent:
			// give it up, as for an unknown outcome.
			b.cleanUpEntries(req, id, []string{token})
			return backend.Lease{}, fail(ctx, op+": keep-alive of the session", kaErr)
		}
	}
	lease := backend.Lease{
		Key:      req.Key,
		HolderID: req.HolderID,
		Token:    token,
		// The transaction's writes are at this revision, the holder
		// key's create revision.
		Term: uint64(resp.Header.Revision),
		TTL:  ttl,
		Entry: &backend.Entry{
			Mode:      req.Mode,
			Limit:     req.Limit,
			Ancestors: slices.Clone(req.Ancestors),
		},
	}
	if onSess {
		if !s.marked {
			b.sessionMarked(secs, s.id)
		}
		b.ownEntry(id, lease)
	}
	if req.WaitID != "" {
		// The transaction deleted the registration, in either mode.
		b.forgetWait(req.Key, req.WaitID)
		b.dropRegistrations(b.waiterKey(req.Key, req.Mode, req.WaitID), b.waiterKey(req.Key, otherMode(req.Mode), req.WaitID))
	}
	b.setSeenHeld(req.Key, false)
	return lease, nil
}

// setPendingMode adds d to the acquisitions in flight of req's key and of
// each of its ancestors (RenewBatch's orphan sweep leaves every key of
// theirs alone meanwhile: the entry, its intents, the registration).
func (b *Backend) setPendingMode(req backend.ModeRequest, d int) {
	b.setPending(req.Key, d)
	for _, a := range req.Ancestors {
		b.setPending(a, d)
	}
}

// entryKeys returns the etcd keys of entry l: its holder key and its
// intents.
func (b *Backend) entryKeys(l backend.Lease) (holder string, intents []string, err error) {
	holder, err = b.holderKey(l.Key, l.Entry.Mode, l.Entry.Limit, l.Token)
	if err != nil {
		return "", nil, err
	}
	for _, a := range l.Entry.Ancestors {
		intents = append(intents, b.intentKey(a, l.Entry.Mode, l.Token))
	}
	return holder, intents, nil
}

// ownEntry records that this Backend holds entry l, and its intents, on
// session lease id (RenewBatch's owner check and orphan sweep).
func (b *Backend) ownEntry(id clientv3.LeaseID, l backend.Lease) {
	b.forEntryKeys(l, func(k string) { b.own(id, k, l.Token) })
}

// disownEntry forgets entry l, and its intents, on session lease id.
func (b *Backend) disownEntry(id clientv3.LeaseID, l backend.Lease) {
	b.forEntryKeys(l, func(k string) { b.disown(id, k, l.Token) })
}

// forEntryKeys calls f with the key of entry l and of each of its intents,
// without the Backend's prefix.
func (b *Backend) forEntryKeys(l backend.Lease, f func(key string)) {
	hk, intents, err := b.entryKeys(l)
	if err != nil {
		return
	}
	f(hk[len(b.prefix):])
	for _, k := range intents {
		f(k[len(b.prefix):])
	}
}

// cleanUpEntries deletes, in the background, the entries with the given
// tokens (and their intents) that an acquisition of req whose outcome is
// unknown may have put on session lease id, or that a Release that failed
// left there, each only while its holder key is still attached to id and
// holds its token (see cleanUp, which does the same for Acquire's keys).
func (b *Backend) cleanUpEntries(req backend.ModeRequest, id clientv3.LeaseID, tokens []string) {
	var ops []clientv3.Op
	for _, token := range tokens {
		l := backend.Lease{Key: req.Key, HolderID: req.HolderID, Token: token,
			Entry: &backend.Entry{Mode: req.Mode, Limit: req.Limit, Ancestors: req.Ancestors}}
		hk, intents, err := b.entryKeys(l)
		if err != nil {
			continue
		}
		h := recordHeader(token, req.HolderID)
		del := []clientv3.Op{clientv3.OpDelete(hk)}
		for _, k := range intents {
			del = append(del, clientv3.OpDelete(k))
		}
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{
			clientv3.Compare(clientv3.LeaseValue(hk), "=", id),
			clientv3.Compare(clientv3.Value(hk), ">", h),
			clientv3.Compare(clientv3.Value(hk), "<", h[:len(h)-1]+"\x0b"),
		}, del, nil))
	}
	if len(ops) == 0 || !b.track() {
		return
	}
	go func() {
		defer b.watches.Done()
		closed := false
		retryCleanUp(b.life, func() bool {
			for len(ops) > 0 {
				// At most MaxLimit entries, each a transaction of at most
				// 1+41 operations (the ancestors' bound): within
				// --max-txn-ops along the deepest path.
				n := min(len(ops), MaxLimit)
				ctx, cancel := context.WithTimeout(b.life, b.timeout)
				_, err := b.cli.Txn(ctx).Then(ops[:n]...).Commit()
				cancel()
				switch {
				case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
					ops = ops[n:]
					continue
				case b.life.Err() != nil:
					closed = true
					return true
				}
				return false
			}
			return true
		})
		if closed || len(ops) > 0 {
			return // the Backend was closed
		}
		for _, token := range tokens {
			b.disownEntry(id, backend.Lease{Key: req.Key, HolderID: req.HolderID, Token: token,
				Entry: &backend.Entry{Mode: req.Mode, Limit: req.Limit, Ancestors: req.Ancestors}})
		}
	}()
}

// acquireTxn is the transaction of one AcquireMode.
type acquireTxn struct {
	cmps       []clientv3.Cmp
	then, fail []clientv3.Op
	token      string   // the entry's token (not limited Shared)
	slots      int      // limited Shared: the number of slot transactions
	slotTokens []string // limited Shared: the token of each slot
}

// tokens returns every token the transaction may give its entry.
func (t acquireTxn) tokens() []string {
	if t.slots > 0 {
		return t.slotTokens
	}
	return []string{t.token}
}

// buildAcquire builds the transaction of req: the entry and its intents
// attached to etcd lease id (onSession: a session lease), a registration
// to session lease regID; w is the request's registration as this Backend
// remembers it.
func (b *Backend) buildAcquire(req backend.ModeRequest, id, regID clientv3.LeaseID, onSession bool, w waitState) (acquireTxn, error) {
	var t acquireTxn
	key := req.Key
	exclusive := req.Mode == backend.Exclusive
	register := req.WaitID != "" && (exclusive || req.Fair)
	var wkeys []string // the registration's key in this mode, then in the other
	if req.WaitID != "" {
		wkeys = []string{b.waiterKey(key, req.Mode, req.WaitID), b.waiterKey(key, otherMode(req.Mode), req.WaitID)}
	}
	var mismatch []clientv3.Cmp
	t.cmps, mismatch = b.conflictCmps(req, w)
	t.fail = b.stateReads(req)
	if register {
		// A registration in the other mode (the WaitID changed mode) is
		// replaced. The put stays last (modeConflict looks for it there).
		reg := []clientv3.Op{
			clientv3.OpDelete(wkeys[1]),
			clientv3.OpPut(wkeys[0], strconv.Quote(req.HolderID), clientv3.WithLease(regID)),
		}
		if exclusive {
			t.fail = append(t.fail, reg...)
		} else {
			// Nothing is written on a limit mismatch.
			t.fail = append(t.fail, clientv3.OpTxn(mismatch, reg, nil))
		}
	}
	if req.RegisterOnly {
		// Nothing to take: the success branch registers and reads as
		// the failure branch does.
		t.then = t.fail
		return t, nil
	}
	return b.buildSuccess(t, req, id, onSession, wkeys)
}

// stateReads returns the reads of the failure branch of req's transaction:
// the key's whole state, each ancestor's lease record and holders, and,
// when the ancestor-waiter rule applies (hierarchical, not Fair), the
// number of each ancestor's Exclusive waiters.
func (b *Backend) stateReads(req backend.ModeRequest) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(b.leaseKey(req.Key), clientv3.WithRange(b.stateEnd(req.Key)))}
	for _, a := range req.Ancestors {
		ops = append(ops, clientv3.OpGet(b.leaseKey(a), clientv3.WithRange(b.entryBase(a)+intentsPart)))
	}
	if !req.Fair {
		for _, a := range req.Ancestors {
			ops = append(ops, clientv3.OpGet(b.entryBase(a)+exclusiveWaiters, clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
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
	// holder at all; unless Fair, no Exclusive waiter either (writer
	// preference across the tree).
	for _, a := range req.Ancestors {
		ab := b.entryBase(a)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(b.leaseKey(a)), "=", 0))
		if exclusive {
			cmps = append(cmps, noneWithPrefix(ab+holdersPart))
		} else {
			cmps = append(cmps, noneWithPrefix(ab+exclusiveHolders))
		}
		if !req.Fair {
			cmps = append(cmps, noneWithPrefix(ab+exclusiveWaiters))
		}
	}
	return cmps, mismatch
}

// buildSuccess adds to t what a successful acquisition of req with etcd
// lease id writes, deleting the registration's keys wkeys (if any).
func (b *Backend) buildSuccess(t acquireTxn, req backend.ModeRequest, id clientv3.LeaseID, onSession bool, wkeys []string) (acquireTxn, error) {
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
		for _, k := range wkeys {
			ops = append(ops, clientv3.OpDelete(k))
		}
		return ops, nil
	}
	if exclusive || req.Limit == 0 {
		t.token = entryToken(id, now, -1, onSession)
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
		t.slotTokens[i] = entryToken(id, now, i, onSession)
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
// key and its ancestors, and the registration on session lease regID) into
// an error: a *backend.HeldError, or one wrapping backend.ErrLimitMismatch.
// It records the registration, and revokes fresh, a grant of the attempt
// that holds nothing (0: none).
func (b *Backend) modeConflict(ctx context.Context, op string, req backend.ModeRequest, register bool, regID, fresh clientv3.LeaseID,
	w waitState, rs []*etcdserverpb.ResponseOp, rev int64, sent time.Time) error {
	exclusive := req.Mode == backend.Exclusive
	n := len(req.Ancestors)
	st := b.splitState(req.Key, rs[0].GetResponseRange().Kvs)
	ancs := make([]keyState, n)
	ancWaiting := make([]int64, n) // Exclusive waiters of each ancestor
	for i, a := range req.Ancestors {
		ancs[i] = b.splitState(a, rs[1+i].GetResponseRange().Kvs)
		if !req.Fair {
			ancWaiting[i] = rs[1+n+i].GetResponseRange().Count
		}
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

	// The registration: its place in line.
	wkey, okey := "", ""
	var before *mvccpb.KeyValue // the registration as it was before
	if req.WaitID != "" {
		wkey = b.waiterKey(req.Key, req.Mode, req.WaitID)
		okey = b.waiterKey(req.Key, otherMode(req.Mode), req.WaitID)
		for _, kv := range st.waiters {
			if string(kv.Key) == wkey {
				before = kv
			}
		}
	}
	var revoke []clientv3.LeaseID
	if fresh != 0 {
		revoke = append(revoke, fresh) // holds nothing
	}
	myRev := int64(0)
	if registered {
		myRev = rev
		if before != nil {
			myRev = before.CreateRevision
		}
		secs, _ := ttlSeconds(req.TTL)
		expires := sent.Add(req.TTL)
		b.setWaitState(req.Key, req.WaitID, waitState{rev: myRev, mode: req.Mode, lease: regID, secs: secs, expires: expires})
		// The failure branch put it: at the transaction's revision.
		b.noteRegistration(secs, regID, wkey, req.Key, req.WaitID, expires, rev)
		b.dropRegistrations(okey)
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
			// Not counting this request's own registration, in either
			// mode.
			if k := string(kv.Key); k != wkey && k != okey && (myRev == 0 || kv.CreateRevision < myRev) {
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
	// Only an ancestor's Exclusive waiters in the way: the outermost
	// such ancestor names the conflict.
	holderKey, holderState := req.Key, st
	if len(conflicts) == 0 && waiting == 0 {
		for i, a := range req.Ancestors {
			if ancWaiting[i] > 0 {
				holderKey, holderState, waiting = a, ancs[i], int(ancWaiting[i])
				break
			}
		}
	}

	if req.Fair && registered && len(conflicts) == 0 && waiting == 0 && w.rev != myRev {
		if _, err := b.entryRecords(ctx, nil, nil, revoke); err != nil {
			return fail(ctx, op, err)
		}
		return &staleWait{}
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
		held.Holder = backend.Record{Key: holderKey}
		var all []*mvccpb.KeyValue
		if holderState.plain != nil {
			all = append(all, holderState.plain)
		}
		all = append(all, holderState.holders...)
		if len(all) > 0 {
			slices.SortFunc(all, func(x, y *mvccpb.KeyValue) int { return cmp.Compare(x.CreateRevision, y.CreateRevision) })
			if r, err := b.entryRecords(ctx, []string{holderKey}, all[:1], nil); err == nil && len(r) == 1 {
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
	out, err := b.completeLive(ctx, op, recs, ids)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(x, y backend.Record) int { return cmp.Compare(x.Term, y.Term) })
	return out, nil
}

// CancelWait withdraws the registration waitID of key: one transaction
// deleting its key in either mode, whoever made it (a registration rides
// on its Backend's session lease, which stays). Watchers of the key see
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
	wx, ws := b.waiterKey(key, backend.Exclusive, waitID), b.waiterKey(key, backend.Shared, waitID)
	if _, err := b.cli.Txn(ctx).Then(clientv3.OpDelete(wx), clientv3.OpDelete(ws)).Commit(); err != nil {
		// The registration stays known here: it is withdrawn at its TTL.
		return fail(ctx, fmt.Sprintf("cancel wait %q of %q", waitID, key), err)
	}
	b.forgetWait(key, waitID)
	b.dropRegistrations(wx, ws)
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
// then a keep-alive of the entry's etcd lease, which its intents share. For
// an entry on a session, the two are sent together (see
// renewEntryOnSession).
func (b *Backend) renewEntry(ctx context.Context, l backend.Lease, id clientv3.LeaseID) error {
	cmps, _, err := b.entryOwnerCheck(l, id, true)
	if err != nil {
		return fmt.Errorf("etcdbackend: renew %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	if onSession(l.Token) {
		return b.renewEntryOnSession(ctx, l, id, cmps)
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

// renewEntryOnSession is Renew of an entry on session lease id: the
// owner-checked read-only transaction (cmps, checking the entry and its
// intents) and a keep-alive of the session, sent together, as
// renewOnSession does for Acquire's keys.
func (b *Backend) renewEntryOnSession(ctx context.Context, l backend.Lease, id clientv3.LeaseID, cmps []clientv3.Cmp) error {
	var (
		check *clientv3.TxnResponse
		err   error
		wg    sync.WaitGroup
	)
	wg.Go(func() { check, err = b.cli.Txn(ctx).If(cmps...).Commit() })
	kaErr := b.keepSession(ctx, id)
	wg.Wait()
	switch {
	case errors.Is(kaErr, backend.ErrLeaseLost):
		return fmt.Errorf("etcdbackend: renew %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, kaErr)
	case err != nil:
		return fail(ctx, fmt.Sprintf("renew %q", l.Key), err)
	case !check.Succeeded:
		b.disownEntry(id, l)
		return fmt.Errorf("etcdbackend: renew %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
	case kaErr != nil:
		return fail(ctx, fmt.Sprintf("renew %q: keep-alive", l.Key), kaErr)
	}
	return nil
}

// releaseEntry is Release of an entry: one owner-checked transaction
// deletes the entry and its intents (see releaseOps: watchers of the key
// and of each ancestor see backend.EventReleased). An entry on a session
// is then done (see releaseEntryOnSession); an entry with a lease of its
// own (Detached) has that lease, which holds only its lease mark now,
// revoked.
func (b *Backend) releaseEntry(ctx context.Context, l backend.Lease, id clientv3.LeaseID) error {
	// Release deletes whatever of the entry is left.
	cmps, hk, err := b.entryOwnerCheck(l, id, false)
	if err != nil {
		return fmt.Errorf("etcdbackend: release %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	if onSession(l.Token) {
		return b.releaseEntryOnSession(ctx, l, id, cmps, hk)
	}
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(b.releaseOps(l, hk)...).Commit()
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

// releaseOps returns the writes of the release of entry l, whose holder
// key is hk: deleting it and its intents, and nothing else. Their revision
// deletes no lease mark, so watchers of the key and of its ancestors
// report a release (see deletionType).
func (b *Backend) releaseOps(l backend.Lease, hk string) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpDelete(hk)}
	for _, a := range l.Entry.Ancestors {
		ops = append(ops, clientv3.OpDelete(b.intentKey(a, l.Entry.Mode, l.Token)))
	}
	return ops
}

// releaseEntryOnSession is Release of an entry on session lease id: the
// owner-checked transaction (cmps, on holder key hk) alone; the session
// stays. When the outcome is unknown, the entry is deleted in the
// background, as Acquire's keys are.
func (b *Backend) releaseEntryOnSession(ctx context.Context, l backend.Lease, id clientv3.LeaseID, cmps []clientv3.Cmp, hk string) error {
	resp, err := b.cli.Txn(ctx).If(cmps...).Then(b.releaseOps(l, hk)...).Commit()
	if err != nil {
		req := backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: l.Key, HolderID: l.HolderID},
			Mode: l.Entry.Mode, Limit: l.Entry.Limit, Ancestors: l.Entry.Ancestors}
		b.cleanUpEntries(req, id, []string{l.Token})
		return fail(ctx, fmt.Sprintf("release %q", l.Key), err)
	}
	b.disownEntry(id, l)
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: release %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
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
