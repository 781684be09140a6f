package etcdbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

// session is the etcd lease that the acquisitions of one TTL that are not
// Detached share, with the waiter registrations of that TTL (see the
// package doc, "Sessions"), granted for that TTL plus its headroom
// (sessionHeadroom).
type session struct {
	mu       sync.Mutex       // serialises grants; guards id, ttl, lastSent
	id       clientv3.LeaseID // 0: none yet, or lost
	ttl      int64            // granted TTL of id, in seconds
	lastSent time.Time        // send time of the grant or last keep-alive of id that succeeded
	// marked reports that a transaction putting the lease mark of id
	// (leaseMark) has succeeded: until then, every acquisition on id puts
	// it with its record.
	marked bool
	// retired holds the full session leases of this TTL that came before
	// id and may still have keys (see sessionFull), with what lastSent
	// and ttl are for id; each is forgotten once it has expired by the
	// local clock (pruneRetiredLocked), as id is when it is granted again.
	retired map[clientv3.LeaseID]retiredLease

	// regMu guards the registrations below. It is taken before b.mu
	// (so that a registration is recorded in regs and in b.owned in one
	// step), never while b.mu or mu is held.
	regMu   sync.Mutex
	regs    map[string]sessionReg // waiter registrations on a session lease of this TTL, by etcd key
	timer   *time.Timer           // withdraws the registrations due (expireRegistrations); nil until the first
	timerAt time.Time             // when timer fires; zero: not armed
	// withdrawals counts the withdrawals of due registrations begun, and
	// withdrawing those under way: a retry's read-only probe trusts
	// that its registration is still there only when no withdrawal began
	// or was under way while it ran (see regQuiet).
	withdrawals uint64
	withdrawing int
}

// sessionReg is a waiter registration this Backend made on a session
// lease: key and waitID are its AcquireMode's, expires when the Backend
// withdraws it unless a retry refreshes it first.
type sessionReg struct {
	id          clientv3.LeaseID
	key, waitID string
	expires     time.Time
	// modRev is the mod revision of the registration's last put by this
	// Backend (0: unknown, after a transaction whose outcome is unknown):
	// its withdrawal deletes it only while it still has it, so a retry
	// that puts it again after the withdrawal began keeps it.
	modRev int64
}

// sessionState is what Acquire needs of a session: its lease, TTL, and
// the send time of its last grant or keep-alive.
type sessionState struct {
	id       clientv3.LeaseID
	ttl      int64
	lastSent time.Time
	marked   bool // see session.marked
}

// sessionFor returns the session of TTL secs, made on demand.
func (b *Backend) sessionFor(secs int64) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessions[secs]
	if s == nil {
		s = &session{}
		b.sessions[secs] = s
	}
	return s
}

// sessionLease returns the session of TTL secs, granting its lease if there
// is none, if, by the local clock, it has expired since its last
// keep-alive, or if it is full (sessionFull: it then stays, with its keys,
// and the new lease takes the acquisitions that follow).
//
// The common case, a live session that is not full, takes s.mu and b.mu one
// after the other, not b.mu with s.mu held: acquisitions of one TTL in
// parallel then do not queue on s.mu behind one that waits for b.mu. The
// state returned may change as soon as it is returned, as it may when
// s.mu is released: an acquisition on a lease that has just gone is
// retried (acquireOnSession), and the cap is soft (sessionFull).
func (b *Backend) sessionLease(ctx context.Context, secs int64) (sessionState, error) {
	s := b.sessionFor(secs)
	s.mu.Lock()
	st := sessionState{s.id, s.ttl, s.lastSent, s.marked}
	s.mu.Unlock()
	if st.id != 0 && time.Since(st.lastSent) < time.Duration(st.ttl)*time.Second && !b.sessionFull(st.id) {
		return st, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	live := s.id != 0 && time.Since(s.lastSent) < time.Duration(s.ttl)*time.Second
	if live && !b.sessionFull(s.id) {
		return sessionState{s.id, s.ttl, s.lastSent, s.marked}, nil
	}
	sent := time.Now()
	grant, err := b.cli.Grant(ctx, secs+sessionHeadroom(secs))
	if err != nil {
		return sessionState{}, err
	}
	switch {
	case s.id != 0 && !live:
		b.forgetLease(s.id)
	case s.id != 0:
		if s.retired == nil {
			s.retired = make(map[clientv3.LeaseID]retiredLease)
		}
		s.retired[s.id] = retiredLease{s.ttl, s.lastSent}
	}
	b.pruneRetiredLocked(s, sent)
	s.id, s.ttl, s.lastSent, s.marked = grant.ID, grant.TTL, sent, false
	return sessionState{s.id, s.ttl, s.lastSent, false}, nil
}

// sessionMarked records that a transaction putting the lease mark of
// session lease id, of TTL secs, has succeeded.
func (b *Backend) sessionMarked(secs int64, id clientv3.LeaseID) {
	s := b.sessionFor(secs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.id == id {
		s.marked = true
	}
}

// sessionKept records a keep-alive of etcd lease id sent at sent that
// succeeded, if id is a current session's lease.
func (b *Backend) sessionKept(id clientv3.LeaseID, sent time.Time) {
	for _, s := range b.sessionList() {
		s.mu.Lock()
		if s.id == id && sent.After(s.lastSent) {
			s.lastSent = sent
		}
		if r, ok := s.retired[id]; ok && sent.After(r.lastSent) {
			r.lastSent = sent
			s.retired[id] = r
		}
		b.pruneRetiredLocked(s, time.Now())
		s.mu.Unlock()
	}
}

// sessionList returns the sessions. A session's mu is never locked with
// b.mu held (sessionLease holds it across a grant, and takes b.mu).
func (b *Backend) sessionList() []*session {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*session, 0, len(b.sessions))
	for _, s := range b.sessions {
		out = append(out, s)
	}
	return out
}

// sessionLost forgets etcd lease id, found gone: the next acquisition on
// its TTL grants a new session, and the keys that were on it are lost,
// waiter registrations included.
func (b *Backend) sessionLost(id clientv3.LeaseID) {
	if id == 0 {
		return
	}
	for _, s := range b.sessionList() {
		s.mu.Lock()
		if s.id == id {
			s.id = 0
		}
		delete(s.retired, id)
		s.mu.Unlock()
		s.regMu.Lock()
		for k, r := range s.regs {
			if r.id == id {
				delete(s.regs, k)
			}
		}
		s.regMu.Unlock()
	}
	b.forgetLease(id)
}

// sessionKeepAlive sends a keep-alive of session lease id in the
// background, and returns a function that waits for its outcome.
func (b *Backend) sessionKeepAlive(ctx context.Context, id clientv3.LeaseID) func() error {
	var (
		err error
		wg  sync.WaitGroup
	)
	wg.Go(func() {
		sent := time.Now()
		if _, err = b.keepAliveOnce(ctx, id); err == nil {
			b.sessionKept(id, sent)
		}
	})
	return func() error {
		wg.Wait()
		return err
	}
}

// noteRegistration records waiter registration etcdKey (waitID of key) on
// session lease id of TTL secs, to be withdrawn at expires unless noted
// again with a later time first (see expireRegistrations), and owned by
// this Backend until then (RenewBatch's orphan sweep leaves it alone).
// modRev is the mod revision the registration has, as the request that
// put or read it found (0: unknown).
func (b *Backend) noteRegistration(secs int64, id clientv3.LeaseID, etcdKey, key, waitID string, expires time.Time, modRev int64) {
	if id == 0 {
		return
	}
	s := b.sessionFor(secs)
	s.regMu.Lock()
	defer s.regMu.Unlock()
	b.noteRegistrationLocked(s, id, etcdKey, key, waitID, expires, modRev)
}

// noteRefresh is noteRegistration for a registration that a retry's
// read-only probe found, sent when regQuiet returned epoch and true: it
// notes it, and reports so, only if no withdrawal of the session's
// registrations has begun since, checked in the same step, so none can
// delete what the probe read after it moved the registration's end.
func (b *Backend) noteRefresh(secs int64, id clientv3.LeaseID, etcdKey, key, waitID string, expires time.Time, modRev int64, epoch uint64) bool {
	if id == 0 {
		return false
	}
	s := b.sessionFor(secs)
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if s.withdrawing != 0 || s.withdrawals != epoch {
		return false
	}
	b.noteRegistrationLocked(s, id, etcdKey, key, waitID, expires, modRev)
	return true
}

// noteRegistrationLocked is noteRegistration with s.regMu held.
func (b *Backend) noteRegistrationLocked(s *session, id clientv3.LeaseID, etcdKey, key, waitID string, expires time.Time, modRev int64) {
	// Owned and known in the same step, so that a withdrawal that
	// finishes meanwhile cannot disown it after it was noted again.
	b.own(id, etcdKey[len(b.prefix):], waitID)
	if r, ok := s.regs[etcdKey]; ok && r.id != id {
		// Put again on a later session lease (the one before it is
		// full or gone): it is no longer on that one.
		b.disown(r.id, etcdKey[len(b.prefix):], r.waitID)
	}
	if s.regs == nil {
		s.regs = make(map[string]sessionReg)
	}
	s.regs[etcdKey] = sessionReg{id: id, key: key, waitID: waitID, expires: expires, modRev: modRev}
	b.armRegTimerLocked(s, expires)
}

// regQuiet returns how many withdrawals of due registrations the session
// of TTL secs has begun, and whether none is under way. A retry's probe
// sent after it returned true, and noted by noteRefresh with the count it
// returned, read the registration with no withdrawal sent or pending: the
// registration is still there, unless something else deleted it.
func (b *Backend) regQuiet(secs int64) (uint64, bool) {
	s := b.sessionFor(secs)
	s.regMu.Lock()
	defer s.regMu.Unlock()
	return s.withdrawals, s.withdrawing == 0
}

// armRegTimerLocked makes s's timer fire no later than at. It runs with
// s.regMu held.
func (b *Backend) armRegTimerLocked(s *session, at time.Time) {
	if !s.timerAt.IsZero() && !at.Before(s.timerAt) {
		return
	}
	s.timerAt = at
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(at), func() { b.expireRegistrations(s, time.Now()) })
		return
	}
	s.timer.Reset(time.Until(at))
}

// dropRegistrations forgets the registrations with the given etcd keys,
// deleted or replaced.
func (b *Backend) dropRegistrations(etcdKeys ...string) {
	for _, s := range b.sessionList() {
		s.regMu.Lock()
		for _, k := range etcdKeys {
			if r, ok := s.regs[k]; ok {
				delete(s.regs, k)
				b.disown(r.id, k[len(b.prefix):], r.waitID)
			}
		}
		s.regMu.Unlock()
	}
}

// expireRegistrations withdraws the registrations of s whose time has
// come: a waiter that stopped trying without CancelWait (or whose
// CancelWait failed) leaves one behind, which the session, kept alive by
// the other keys on it, would keep for as long as it lives. Each is
// deleted only while it is still attached to its session lease and has
// the mod revision of its last put here (one transaction for all of
// them), so a retry that puts it again meanwhile keeps it; when that
// fails, they are tried again after cleanUpRetry. A retry whose read-only
// probe ran while a withdrawal was under way puts its registration again
// instead of trusting the read (see regQuiet). It runs on s's timer, at
// now, and arms it for the next.
func (b *Backend) expireRegistrations(s *session, now time.Time) {
	due := make(map[string]sessionReg)
	s.regMu.Lock()
	s.timerAt = time.Time{}
	next := time.Time{}
	for k, r := range s.regs {
		if !r.expires.After(now) {
			due[k] = r
			delete(s.regs, k)
		} else if next.IsZero() || r.expires.Before(next) {
			next = r.expires
		}
	}
	if !next.IsZero() {
		b.armRegTimerLocked(s, next)
	}
	if len(due) > 0 {
		s.withdrawals++
		s.withdrawing++
	}
	s.regMu.Unlock()
	if len(due) == 0 {
		return
	}
	if !b.track() {
		s.regMu.Lock()
		s.withdrawing--
		s.regMu.Unlock()
		return
	}
	defer b.watches.Done()
	b.withdrawalStage("delete")
	var ops []clientv3.Op
	for k, r := range due {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", r.id)}
		if r.modRev != 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", r.modRev))
		}
		ops = append(ops, clientv3.OpTxn(cmps, []clientv3.Op{clientv3.OpDelete(k)}, nil))
	}
	var err error
	for len(ops) > 0 && err == nil {
		n := min(len(ops), txnBatchOps/2)
		ctx, cancel := context.WithTimeout(b.life, b.timeout)
		_, err = b.cli.Txn(ctx).Then(ops[:n]...).Commit()
		cancel()
		ops = ops[n:]
	}
	s.regMu.Lock()
	s.withdrawing--
	for k, r := range due {
		if _, again := s.regs[k]; again {
			continue // noted again meanwhile
		}
		if err != nil && b.life.Err() == nil {
			r.expires = now.Add(cleanUpRetry)
			s.regs[k] = r
			b.armRegTimerLocked(s, r.expires)
			continue
		}
		// Forgotten under regMu, so that a retry noting it again
		// (noteRegistration) comes wholly before or after.
		b.disown(r.id, k[len(b.prefix):], r.waitID)
		b.mu.Lock()
		if w, ok := b.waits[waitMapKey(r.key, r.waitID)]; ok && w.lease == r.id && !w.expires.After(now) {
			delete(b.waits, waitMapKey(r.key, r.waitID))
		}
		b.mu.Unlock()
	}
	s.regMu.Unlock()
	b.withdrawalStage("done")
}

// withdrawalStage runs the test hook of expireRegistrations, if any, at
// stage "delete" (the due registrations taken out, their delete not yet
// sent) or "done" (the withdrawal recorded).
func (b *Backend) withdrawalStage(stage string) {
	if f := b.withdrawalHook.Load(); f != nil {
		(*f)(stage)
	}
}

// own records that this Backend holds key on session lease id with token.
func (b *Backend) own(id clientv3.LeaseID, key, token string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ownLocked(id, key, token)
}

// ownLocked is own with b.mu held.
func (b *Backend) ownLocked(id clientv3.LeaseID, key, token string) {
	m := b.owned[id]
	if m == nil {
		m = make(map[string]string)
		b.owned[id] = m
	}
	m[key] = token
}

// acquiredOnSession records, in one step (one lock of b.mu, where each
// alone took one), the end of an acquisition of key with token on session
// lease id that succeeded: this Backend holds key on id (own), the
// acquisition is no longer in flight (setPending), and key was not last
// seen held (setSeenHeld). It is recorded as held in the same step as it
// stops being pending, so RenewBatch's sweep of orphans always finds it
// one or the other.
func (b *Backend) acquiredOnSession(id clientv3.LeaseID, key, token string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ownLocked(id, key, token)
	b.setPendingLocked(key, -1)
	delete(b.held, key)
}

// setPending adds d to the acquisitions of key in flight.
func (b *Backend) setPending(key string, d int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setPendingLocked(key, d)
}

// setPendingLocked is setPending with b.mu held.
func (b *Backend) setPendingLocked(key string, d int) {
	if n := b.pending[key] + d; n > 0 {
		b.pending[key] = n
	} else {
		delete(b.pending, key)
	}
}

// checkScratch is what checkSession needs for one check, kept in
// checkScratchPool between checks, so that a renewal pass clears an index
// of the session's keys rather than building one (growing a map of 2,048
// keys takes a dozen allocations).
type checkScratch struct {
	slot  map[string]int // the keys to find (without the prefix), each with its index in found
	found []bool         // found[slot[k]]: k is among the keys attached to the session
}

// checkScratchPool holds checkScratch values.
var checkScratchPool = sync.Pool{New: func() any { return &checkScratch{slot: make(map[string]int)} }}

// release clears sc (its map holds the callers' key strings) and puts it
// back in checkScratchPool.
func (sc *checkScratch) release() {
	clear(sc.slot)
	clear(sc.found)
	checkScratchPool.Put(sc)
}

// disown forgets key on session lease id if it is still held with token.
func (b *Backend) disown(id clientv3.LeaseID, key, token string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.disownLocked(id, key, token)
}

// disownLocked is disown with b.mu held.
func (b *Backend) disownLocked(id clientv3.LeaseID, key, token string) {
	m := b.owned[id]
	if m[key] == token {
		delete(m, key)
		if len(m) == 0 {
			delete(b.owned, id)
			// Keys put on id while none is held here are not counted
			// (noteEvents): the next renewal on id looks up.
			delete(b.looked, id)
		}
	}
}

// forgetLease forgets every key held on session lease id.
func (b *Backend) forgetLease(id clientv3.LeaseID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.owned, id)
	delete(b.looked, id)
}

// owns reports whether this Backend acquired key with token on session
// lease id, and whether it knows lease id at all.
func (b *Backend) owns(id clientv3.LeaseID, key, token string) (owned, known bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, known := b.owned[id]
	return known && m[key] == token, known
}

// sessionTokenMark is the character after the time part of a token that
// marks a lease on a session (a random part is lower-case hex).
const sessionTokenMark = 's'

// newSessionToken returns the token of an acquisition on session lease id:
// like newToken, with the random part marked.
func newSessionToken(id clientv3.LeaseID, acquiredAt time.Time) string {
	return string(appendToken(make([]byte, 0, tokenLen), id, acquiredAt, sessionTokenMark))
}

// onSession reports whether token was made by newSessionToken.
func onSession(token string) bool {
	return len(token) > 34 && token[33] == '-' && token[34] == sessionTokenMark
}

// sessionHeadroom returns how many seconds longer than secs, the TTL asked
// for in whole seconds, the session lease of that TTL is granted: secs/8
// (none below 8 s, 1 s for 8 to 15 s), so at most 1/8 longer. A key on a
// session lasts at least the session's TTL from the send time of its last
// grant or keep-alive; with that headroom, an acquisition sent within it of
// the session's last grant or keep-alive has its full TTL without a
// keep-alive of its own: a burst of acquisitions (a lock taken and released
// in a loop) sends one keep-alive per headroom, not one each, and an
// acquisition and release pair is two transactions, as etcd's
// concurrency.Mutex TryLock and Unlock are two requests. The price is that
// a key whose holder stopped renewing it (crashed) lasts up to the
// headroom longer: its Lease.TTL says so, being what the session has left
// from the acquisition's send time (at least the TTL asked for, at most
// the session's granted TTL). Below 8 s the headroom would be a large
// share of the TTL (etcd's TTLs are whole seconds), so there is none: such
// an acquisition sends a keep-alive with its transaction unless the
// session was kept alive after it was sent.
func sessionHeadroom(secs int64) int64 { return min(secs/8, maxTTLSeconds-secs) }

// acquireOnSession is Acquire of a lease that is not Detached: one
// transaction attaching the key to the session lease of its TTL (granted
// first, once per session). When etcd says the session lease is gone, it is
// granted again and the transaction retried, once.
func (b *Backend) acquireOnSession(ctx context.Context, req backend.AcquireRequest, secs int64) (backend.Lease, error) {
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		s, err := b.sessionLease(ctx, secs)
		if err != nil {
			return backend.Lease{}, fail(ctx, fmt.Sprintf("acquire %q: grant session lease", req.Key), err)
		}
		full := time.Duration(s.ttl) * time.Second
		// A key attached to the session ends with it: at the receipt of
		// the session's last grant or keep-alive plus its TTL, so at
		// least left after sent. When that is shorter than the TTL asked
		// for, a keep-alive goes with the transaction (sent with it, not
		// before it: no round trip added), after sent, so the key lasts
		// the session's full TTL from sent once it succeeds (see
		// sessionHeadroom).
		var (
			kaErr error
			kaOK  bool
			wg    sync.WaitGroup
		)
		left := full - sent.Sub(s.lastSent)
		needKA := left < req.TTL
		if needKA {
			wg.Go(func() {
				kaSent := time.Now()
				if _, kaErr = b.keepAliveOnce(ctx, s.id); kaErr == nil {
					kaOK = true
					b.sessionKept(s.id, kaSent)
				}
			})
		}
		token := newSessionToken(s.id, sent)
		value, err := appendRecord(nil, token, req.HolderID, recordBody{AcquiredAt: sent, Metadata: req.Metadata})
		if err != nil {
			wg.Wait()
			return backend.Lease{}, fmt.Errorf("etcdbackend: acquire %q: encode record: %w", req.Key, err)
		}
		b.setPending(req.Key, 1)
		lease, err := b.putOnLease(ctx, req, s.id, full, token, value, !s.marked)
		wg.Wait()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(kaErr, rpctypes.ErrLeaseNotFound) {
			if err == nil {
				// The key went on a lease that has just gone: it is gone
				// with it.
				err = fmt.Errorf("etcdbackend: acquire %q: session lease gone: %w", req.Key, rpctypes.ErrLeaseNotFound)
			}
			b.sessionLost(s.id)
			b.setPending(req.Key, -1)
			if attempt == 0 && ctx.Err() == nil {
				continue
			}
			return backend.Lease{}, fail(ctx, fmt.Sprintf("acquire %q", req.Key), err)
		}
		var he *backend.HeldError
		if err != nil && !errors.As(err, &he) {
			// The outcome is unknown: the key may be on the session,
			// held by nobody, and the session would keep it alive.
			b.cleanUp(req.Key, s.id, token, req.HolderID)
		}
		if err != nil {
			b.setPending(req.Key, -1)
			return backend.Lease{}, err
		}
		switch {
		case kaOK:
		case !needKA:
			// The key ends when the session does, at least left after
			// sent, which is at least req.TTL.
			lease.TTL = min(lease.TTL, left)
		default:
			// The key may end before req.TTL has passed since sent: give
			// it up, as for an unknown outcome.
			b.cleanUp(req.Key, s.id, token, req.HolderID)
			b.setPending(req.Key, -1)
			return backend.Lease{}, fail(ctx, fmt.Sprintf("acquire %q: keep-alive of the session", req.Key), kaErr)
		}
		if !s.marked {
			b.sessionMarked(secs, s.id)
		}
		b.acquiredOnSession(s.id, req.Key, token)
		return lease, nil
	}
}

// putOnLease runs Acquire's transaction putting value, the record of req
// with token, attached to etcd lease id of TTL ttl, and with it (mark) the
// lease mark of id (leaseMark). A held key is a *backend.HeldError.
func (b *Backend) putOnLease(ctx context.Context, req backend.AcquireRequest, id clientv3.LeaseID, ttl time.Duration, token string, value []byte, mark bool) (backend.Lease, error) {
	k := b.acquireKeys(req.Key)
	ops := []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: k.rec, Value: value, Lease: int64(id),
	}}}}
	if mark {
		ops = append(ops, putOp(b.leaseMark(id), "", id))
	}
	resp, err := b.txn(ctx, &pb.TxnRequest{
		Compare: k.freeCheck(),
		Success: ops,
		Failure: k.holderReads(),
	})
	if err != nil {
		return backend.Lease{}, fail(ctx, fmt.Sprintf("acquire %q", req.Key), err)
	}
	if !resp.Succeeded {
		return backend.Lease{}, b.heldError(ctx, req.Key, resp, 0)
	}
	return backend.Lease{
		Key:      req.Key,
		HolderID: req.HolderID,
		Token:    token,
		Term:     uint64(resp.Header.Revision),
		TTL:      ttl,
	}, nil
}

// cleanUpRetry is the pause before a withdrawal of waiter registrations
// that failed is tried again (expireRegistrations), and the first pause
// between two attempts of a background clean-up (see cleanUpDelay).
const cleanUpRetry = time.Second

// cleanUpMaxRetry is the longest pause between two attempts of a
// background clean-up (see cleanUpDelay).
const cleanUpMaxRetry = 8 * time.Second

// cleanUpDelay returns the pause after the n-th failed attempt (n ≥ 1) of a
// background clean-up (cleanUp, cleanUpEntries): capped exponential backoff
// with jitter. Its bound d is cleanUpRetry doubled after each failure
// (1 s, 2 s, 4 s, ...) up to cleanUpMaxRetry, and the pause a random
// point of the upper half of it, [d/2, d]. During a store outage every
// Release fails and leaves a clean-up behind: with a fixed pause they
// would all try again together, each second, as a herd, for as long as it
// lasts; this spreads them over half their bound and thins them out as the
// outage goes on. The price is the time a record held by nobody stays
// once the store is back, at most cleanUpMaxRetry (it ends sooner with
// its session lease).
func cleanUpDelay(n int) time.Duration {
	d := cleanUpMaxRetry
	if n >= 1 && n < 16 {
		d = min(cleanUpRetry<<(n-1), cleanUpMaxRetry)
	}
	return d/2 + rand.N(d/2+1)
}

// retryCleanUp calls try until it reports done, pausing cleanUpDelay(n)
// after its n-th attempt, or until life ends (the Backend is closed).
func retryCleanUp(life context.Context, try func() (done bool)) {
	for n := 1; !try(); n++ {
		t := time.NewTimer(cleanUpDelay(n))
		select {
		case <-life.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// cleanUp deletes, in the background, the record with token that an
// acquisition whose outcome is unknown may have written on session lease
// id, or that a Release that failed has left there, retrying until it is
// done, the session lease is gone (and the record with it) or the Backend
// is closed, pausing between attempts as cleanUpDelay says. Nothing would end such a record otherwise: the session lives
// on as long as other keys on it are renewed.
func (b *Backend) cleanUp(key string, id clientv3.LeaseID, token, holderID string) {
	if !b.track() {
		return
	}
	go func() {
		defer b.watches.Done()
		k := b.leaseKey(key)
		h := recordHeader(token, holderID)
		retryCleanUp(b.life, func() bool {
			ctx, cancel := context.WithTimeout(b.life, b.timeout)
			_, err := b.cli.Txn(ctx).
				If(
					clientv3.Compare(clientv3.LeaseValue(k), "=", id),
					clientv3.Compare(clientv3.Value(k), ">", h),
					clientv3.Compare(clientv3.Value(k), "<", h[:len(h)-1]+"\x0b"),
				).
				Then(clientv3.OpDelete(k)).
				Commit()
			cancel()
			if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || b.life.Err() != nil {
				b.disown(id, key, token)
				return true
			}
			return false
		})
	}()
}

// releaseOnSession is Release of a lease on a session: one owner-checked
// transaction that deletes the record, and nothing else. Watchers tell the
// deletion from an expiry by the lease mark (see deletionType), so the
// release writes no marker. The session lease stays.
func (b *Backend) releaseOnSession(ctx context.Context, l backend.Lease, id clientv3.LeaseID) error {
	cmps, k := b.tokenCheckKey(l)
	resp, err := b.txn(ctx, &pb.TxnRequest{
		Compare: cmps,
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: k}}}},
	})
	if err != nil {
		// The record may still be on the session, and a caller that gives
		// up on it (the elector after a failed verification) would leave
		// it there for as long as the session lives: delete it in the
		// background too.
		b.cleanUp(l.Key, id, l.Token, l.HolderID)
		return fail(ctx, fmt.Sprintf("release %q", l.Key), err)
	}
	b.disown(id, l.Key, l.Token)
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: release %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
	}
	return nil
}

// renewOnSession is Renew of a lease on a session: the owner-checked
// read-only transaction and a keep-alive of the session lease, sent
// together.
func (b *Backend) renewOnSession(ctx context.Context, l backend.Lease, id clientv3.LeaseID) error {
	var (
		check *clientv3.TxnResponse
		err   error
		wg    sync.WaitGroup
	)
	wg.Go(func() { check, err = b.txn(ctx, &pb.TxnRequest{Compare: b.tokenCheck(l)}) })
	kaErr := b.keepSession(ctx, id)
	wg.Wait()
	switch {
	case errors.Is(kaErr, backend.ErrLeaseLost):
		return fmt.Errorf("etcdbackend: renew %q term %d: %w", l.Key, l.Term, kaErr)
	case err != nil:
		return fail(ctx, fmt.Sprintf("renew %q", l.Key), err)
	case !check.Succeeded:
		b.disown(id, l.Key, l.Token)
		return fmt.Errorf("etcdbackend: renew %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
	case kaErr != nil:
		return fail(ctx, fmt.Sprintf("renew %q: keep-alive", l.Key), kaErr)
	}
	return nil
}

// keepSession sends a keep-alive of session lease id. A lease etcd no
// longer has is lost with every key on it: the error wraps
// backend.ErrLeaseLost.
func (b *Backend) keepSession(ctx context.Context, id clientv3.LeaseID) error {
	sent := time.Now()
	_, err := b.keepAliveOnce(ctx, id)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		b.sessionLost(id)
		return fmt.Errorf("session lease expired: %w", backend.ErrLeaseLost)
	case err != nil:
		return err
	}
	b.sessionKept(id, sent)
	return nil
}

var _ backend.BatchRenewer = (*Backend)(nil)

// RenewBatch implements backend.BatchRenewer. The leases on one session of
// this Backend cost two requests together, sent at once, however many they
// are: a keep-alive of the session lease, and a look-up of the keys attached
// to it (a lease TimeToLive with its keys; no raft write), which the
// Backend's watch makes needless while it is up and has delivered no change
// the look-up could see (see coveredRenewal). Each lease is
// then checked on its own: it is renewed when its key is attached to the
// session and this Backend acquired that key with the lease's token and has
// neither released it nor found it lost since; otherwise it is lost (a key
// deleted by hand, taken by another holder, or acquired again here after
// such a deletion), alone. An entry of backend.Modes on a session is
// checked the same way by its holder key and each of its intents, and is
// lost when any of them is. A session lease etcd no longer has loses every
// key on it. Any other lease (Detached, or on a session this Backend does
// not know) is renewed by Renew, up to 16 at a time.
//
// Why the local record of tokens is an owner check: only this Backend
// attaches keys to its session leases (their IDs are its own grants), and
// it records the token of each key it attaches, in the same step, before it
// can be renewed; a key attached to the session therefore holds the record
// this Backend wrote last for it, whose token it knows.
func (b *Backend) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	errs := make([]error, len(leases))
	ctx, cancel, err := b.begin(ctx, "renew")
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer cancel()
	bySession := make(map[clientv3.LeaseID][]int)
	var single []int
	for i, l := range leases {
		if err := l.Validate(); err != nil {
			errs[i] = fmt.Errorf("etcdbackend: renew: %w", err)
			continue
		}
		if err := checkKey(l.Key); err != nil {
			errs[i] = fmt.Errorf("etcdbackend: renew: %w", err)
			continue
		}
		id, ok := parseToken(l.Token)
		if !ok || !onSession(l.Token) {
			single = append(single, i)
			continue
		}
		bySession[id] = append(bySession[id], i)
	}
	// A session lease this Backend does not know goes to Renew: tested
	// under one lock for the batch, not one per lease.
	b.mu.Lock()
	for id, items := range bySession {
		if _, known := b.owned[id]; !known {
			single = append(single, items...)
			delete(bySession, id)
		}
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelLookups)
	for _, i := range single {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = b.Renew(ctx, leases[i])
		})
	}
	for id, items := range bySession {
		wg.Go(func() { b.renewSession(ctx, id, leases, items, errs) })
	}
	wg.Wait()
	return errs
}

// renewSession renews leases[i] for each i of items, all on session lease
// id, setting errs[i]; see RenewBatch.
func (b *Backend) renewSession(ctx context.Context, id clientv3.LeaseID, leases []backend.Lease, items []int, errs []error) {
	// Read before the look-up is sent, so that a change the watch
	// delivers while it is under way calls for the next one.
	mark, covered := b.coveredRenewal(id)
	var (
		ttl    *clientv3.LeaseTimeToLiveResponse
		ttlErr error
		wg     sync.WaitGroup
	)
	if !covered {
		wg.Go(func() { ttl, ttlErr = b.cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys()) })
	}
	kaErr := b.keepSession(ctx, id)
	wg.Wait()
	if kaErr != nil || ttlErr != nil {
		for _, i := range items {
			l := leases[i]
			switch {
			case errors.Is(kaErr, backend.ErrLeaseLost):
				errs[i] = fmt.Errorf("etcdbackend: renew %q term %d: %w", l.Key, l.Term, kaErr)
			case kaErr != nil:
				errs[i] = fail(ctx, fmt.Sprintf("renew %q: keep-alive", l.Key), kaErr)
			default:
				errs[i] = fail(ctx, fmt.Sprintf("renew %q: look up session keys", l.Key), ttlErr)
			}
		}
		return
	}
	if covered {
		b.checkHeld(id, leases, items, errs, nil, true)
		b.hostLookedUp(id, nil, true)
		return
	}
	// Checked after the reply: an acquisition committed before the
	// look-up is recorded in owned by now, or still pending.
	orphans := b.checkSession(id, leases, items, errs, ttl.Keys)
	b.lookedUp(id, mark)
	b.hostLookedUp(id, ttl.Keys, false)
	if len(orphans) > 0 {
		b.deleteOrphans(ctx, id, orphans, ttl.Revision)
	}
}

// lookMark is what a look-up of the keys attached to a session lease was
// sent under: the cover of the Backend's watch (watchCover) and the count
// of changes it had delivered that a look-up could see (noteEvents).
type lookMark struct {
	cover, changes uint64
}

// coveredRenewal returns the mark to record if a look-up of the keys
// attached to session lease id succeeds now, and reports whether this
// renewal can do without one (covered): when the Backend's watch has been
// established, without a break, a reset or a gap, since the last look-up
// of id that succeeded was sent, the connection is up, and the watch has
// delivered no change since that a look-up could see (noteEvents: a key
// this Backend holds deleted or put on another lease, a key it does not
// hold put on a lease it holds keys on, a heartbeat record changed), the
// look-up would find what this Backend knows, so the keep-alive alone
// renews: an idle holder with a watch sends one request per renewal, as an
// etcd concurrency.Session does, instead of two (issue #13). A change that
// the watch has not delivered yet was not seen either by a look-up sent
// before it happened, which is what the look-up of every renewal gave: the
// window in which a key deleted by hand is still renewed stays one
// renewal interval, plus the watch's delivery.
func (b *Backend) coveredRenewal(id clientv3.LeaseID) (lookMark, bool) {
	cover, live := b.watchCover()
	if !live {
		cover = 0 // a look-up now is not followed by the watch
	}
	b.mu.Lock()
	last, ok := b.looked[id]
	now := lookMark{cover: cover, changes: b.lookChanges}
	b.mu.Unlock()
	return now, live && ok && last == now && ready(b.cli)
}

// lookedUp records that a look-up of the keys attached to session lease id,
// sent under mark, succeeded and was checked, if id still has keys here.
func (b *Backend) lookedUp(id clientv3.LeaseID, mark lookMark) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if mark.cover != 0 && len(b.owned[id]) > 0 {
		b.looked[id] = mark
	}
}

// noteEvents counts the changes among events, delivered by the Backend's
// watch, that a look-up of the keys attached to a session lease could see
// differently from what this Backend knows (see coveredRenewal), so that
// the next renewal of each session looks up. It costs a map look-up per
// held session for each event, and nothing while this Backend holds no key
// on a session. Changes made here (an acquisition whose event comes before it is
// recorded, a release) count too: the next renewal looks up, as every
// renewal did before.
func (b *Backend) noteEvents(events []*clientv3.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Not len(b.looked): a change delivered while the first look-up of a
	// session is in flight must count against the mark it will record.
	if len(b.owned) == 0 {
		return
	}
	for _, ev := range events {
		if b.lookCouldSee(ev) {
			b.lookChanges++
			return
		}
	}
}

// lookCouldSee reports whether ev changes what a look-up of the keys
// attached to a session lease would find, against what this Backend
// knows. b.mu is held.
func (b *Backend) lookCouldSee(ev *clientv3.Event) bool {
	k := ev.Kv.Key
	if len(k) < len(b.prefix) || string(k[:len(b.prefix)]) != b.prefix {
		return false
	}
	key := k[len(b.prefix):]
	if bytes.HasPrefix(key, leaseMarkPartBytes) {
		return false // a lease mark: the look-up skips it
	}
	if bytes.Contains(key, heartbeatInfixBytes) {
		return true // a heartbeat record, maybe one riding on a session
	}
	if m, ok := b.owned[clientv3.LeaseID(ev.Kv.Lease)]; ok && ev.Type == mvccpb.PUT {
		_, held := m[string(key)]
		return !held // on a session lease here, not held: an orphan
	}
	// A deletion of a key held here, or a put of one on another lease.
	for _, m := range b.owned {
		if _, held := m[string(key)]; held {
			return true
		}
	}
	return false
}

// checkSession is the owner check of RenewBatch for leases[i], i in items,
// all on session lease id, from attached, the etcd keys that the look-up
// found attached to it: a lease is renewed when its key (an entry's holder
// key and each of its intents) is among them and this Backend acquired it
// with the lease's token and has neither released it nor found it lost
// since; otherwise errs[i] says it is lost, and it is forgotten. It returns
// the orphans among attached: the keys that this Backend neither holds on
// id nor is acquiring.
//
// It is one pass over attached and one over items, under one lock of b.mu,
// with no string made of a key of attached (a map indexed by a conversion
// of bytes to a string makes none), and its index of the keys to find
// taken from a pool (checkScratch), cleared, not rebuilt: a check of n
// keys costs a constant number of allocations, not one or more per key
// (issue #13).
func (b *Backend) checkSession(id clientv3.LeaseID, leases []backend.Lease, items []int, errs []error, attached [][]byte) []string {
	return b.checkHeld(id, leases, items, errs, attached, false)
}

// checkHeld is checkSession, or, when covered, its check without a look-up
// (see coveredRenewal): every key this Backend holds on id is taken as
// attached, and no orphan is returned.
func (b *Backend) checkHeld(id clientv3.LeaseID, leases []backend.Lease, items []int, errs []error, attached [][]byte, covered bool) []string {
	sc := checkScratchPool.Get().(*checkScratch)
	defer sc.release()
	// The keys to find, without the prefix: each lease's key, or its
	// entry's holder key and intents (nil in entryKeys: the entry's keys
	// could not be made, so it is lost).
	slot := sc.slot
	var entryKeys map[int][]string
	for _, i := range items {
		l := leases[i]
		if l.Entry == nil {
			if _, ok := slot[l.Key]; !ok {
				slot[l.Key] = len(slot)
			}
			continue
		}
		if entryKeys == nil {
			entryKeys = make(map[int][]string)
		}
		hk, intents, err := b.entryKeys(l)
		if err != nil {
			entryKeys[i] = nil
			continue
		}
		ks := make([]string, 0, 1+len(intents))
		for _, k := range append(intents, hk) {
			k = k[len(b.prefix):]
			ks = append(ks, k)
			if _, ok := slot[k]; !ok {
				slot[k] = len(slot)
			}
		}
		entryKeys[i] = ks
	}
	sc.found = slices.Grow(sc.found[:0], len(slot))[:len(slot)]
	found := sc.found
	clear(found) // release cleared it too: this does not rely on that
	if covered {
		for j := range found {
			found[j] = true
		}
	}
	var orphans []string
	b.mu.Lock()
	defer b.mu.Unlock()
	owned := b.owned[id]
	for _, k := range attached {
		if len(k) < len(b.prefix) || string(k[:len(b.prefix)]) != b.prefix {
			continue
		}
		key := k[len(b.prefix):]
		if j, ok := slot[string(key)]; ok {
			found[j] = true
		}
		// An entry, intent or registration of backend.Modes is pending
		// with its key (an intent with its ancestor's).
		of := key
		if n := bytes.IndexByte(key, 0); n >= 0 {
			of = key[:n]
		}
		if _, held := owned[string(key)]; held || b.pending[string(of)] > 0 {
			continue
		}
		if bytes.Contains(key, heartbeatInfixBytes) {
			continue // a heartbeat record riding on the session (hostSession)
		}
		if bytes.HasPrefix(key, leaseMarkPartBytes) {
			continue // the session's lease mark
		}
		orphans = append(orphans, string(k))
	}
	held := func(key, token string) bool {
		return owned != nil && owned[key] == token && found[slot[key]]
	}
	for _, i := range items {
		l := leases[i]
		if l.Entry == nil {
			if !held(l.Key, l.Token) {
				b.disownLocked(id, l.Key, l.Token)
				errs[i] = fmt.Errorf("etcdbackend: renew %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
			}
			continue
		}
		ks := entryKeys[i]
		ok := ks != nil
		for _, k := range ks {
			ok = ok && held(k, l.Token)
		}
		if !ok {
			for _, k := range ks {
				b.disownLocked(id, k, l.Token)
			}
			errs[i] = fmt.Errorf("etcdbackend: renew %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
		}
	}
	return orphans
}

// deleteOrphans deletes the etcd keys orphans from session lease id, each
// only while it is still on that lease and was created at or before
// revision rev (the look-up that found it), so a key acquired since is
// left alone. Such a key is held by nobody: its acquisition was given up
// by its caller after its transaction was sent (a timeout) and committed
// later, after the background clean-up of that acquisition had found
// nothing to delete. The session would keep it alive, the key held by
// nobody, for as long as it lives.
func (b *Backend) deleteOrphans(ctx context.Context, id clientv3.LeaseID, orphans []string, rev int64) {
	var ops []clientv3.Op
	for _, k := range orphans {
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{
				clientv3.Compare(clientv3.LeaseValue(k), "=", id),
				clientv3.Compare(clientv3.CreateRevision(k), "<", rev+1),
			},
			[]clientv3.Op{clientv3.OpDelete(k)}, nil))
	}
	for len(ops) > 0 {
		n := min(len(ops), txnBatchOps)
		if _, err := b.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return // the next batch tries again
		}
		ops = ops[n:]
	}
}

var (
	_ backend.AcquireConfirmer = (*Backend)(nil)
	_ backend.ExpiryReporter   = (*Backend)(nil)
)

// AcquireConfirms implements backend.AcquireConfirmer: Acquire's reply is
// that of the transaction that compared the key free and put the record,
// committed through raft as one step (its revision is the term), so a read
// right after it, linearizable as well, would return the same record and
// prove nothing more. The elector's double verification checks that reply
// instead of sending a Get (a transaction and two lease look-ups).
func (b *Backend) AcquireConfirms() bool { return true }

// ReportsExpiry implements backend.ExpiryReporter: a watch delivers every
// deletion of the watched key, an expiry included (EventExpired), and sends
// EventReset or closes when its stream or the client's connection breaks,
// so a follower with a live watch need not poll for the leader's expiry.
func (b *Backend) ReportsExpiry() bool { return true }

// track counts a goroutine the Backend is about to start among those Close
// waits for (b.watches), unless the Backend is closed; the goroutine calls
// b.watches.Done when it ends.
func (b *Backend) track() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.watches.Add(1)
	return true
}

// leaseMarkPart is what follows the prefix in the etcd key of a lease mark
// (leaseMark). It begins with NUL, which no key contains, so it is no key's
// record, entry or heartbeat.
const leaseMarkPart = "\x00lease/"

// leaseMark returns the etcd key of the lease mark of etcd lease id: an
// empty value attached to id, put on every etcd lease this Backend attaches
// lease records or entries to, in the transaction that attaches the first
// of them (on a session lease: every acquisition's transaction until one of
// them has succeeded; waiter registrations, whose deletions are reported
// alike whatever their cause, need none; on a Detached lease: the
// transaction that puts its record or entry), and so deleted by the
// revocation that ends id, at the same revision as every key on it. It
// lives as long as its lease, one per lease.
func (b *Backend) leaseMark(id clientv3.LeaseID) string {
	return b.prefix + leaseMarkPart + strconv.FormatUint(uint64(id), 16)
}

// deletionType returns the event that the deletion events[i] of the record
// or an entry of key reports to watchers of key. Its revision deleted a
// lease mark (leaseMark) exactly when an etcd lease ended in it, taking
// every key attached to it: the deletion is then an expiry
// (backend.EventExpired), unless the same transaction put key's release
// marker (earlier versions of this package wrote one with the Release of
// a Detached lease or of an entry of backend.Modes). Any other deletion is
// a release (backend.EventReleased): a Release deletes the record (or the
// entry and its intents) alone, so that it costs one transaction of
// deletions and nothing else. A deletion by hand is reported as a
// release too, and so is the expiry of a lease granted by a version of this
// package that put no lease mark. The events of one revision are next to
// each other in a watch response.
func (b *Backend) deletionType(events []*clientv3.Event, i int, key string) backend.EventType {
	if releasedWith(events, i, b.prefix+key+"\x00") {
		return backend.EventReleased
	}
	rev := events[i].Kv.ModRevision
	mark := func(ev *clientv3.Event) bool {
		k := ev.Kv.Key
		return ev.Type == mvccpb.DELETE && len(k) > len(b.prefix)+len(leaseMarkPart) &&
			string(k[:len(b.prefix)]) == b.prefix && string(k[len(b.prefix):len(b.prefix)+len(leaseMarkPart)]) == leaseMarkPart
	}
	for j := i - 1; j >= 0 && events[j].Kv.ModRevision == rev; j-- {
		if mark(events[j]) {
			return backend.EventExpired
		}
	}
	for j := i + 1; j < len(events) && events[j].Kv.ModRevision == rev; j++ {
		if mark(events[j]) {
			return backend.EventExpired
		}
	}
	return backend.EventReleased
}
