package etcdbackend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/sovereign-go/sovereign/backend"
)

var _ backend.BatchHeartbeater = (*Backend)(nil)

// hbSession is the etcd lease that the heartbeat records of one TTL,
// written by HeartbeatBatch, share, or the session of plain acquisitions
// they ride on meanwhile (hostSession).
type hbSession struct {
	mu       sync.Mutex                  // serialises batches of this TTL; guards the fields below
	secs     int64                       // requested TTL of the records, in seconds
	id       clientv3.LeaseID            // 0: none yet, or lost
	on       clientv3.LeaseID            // the lease the records are on: id, or a host session's (0: none)
	ttl      int64                       // granted TTL of id, in seconds
	lastSent time.Time                   // send time of the grant or last keep-alive of id that succeeded
	lastLook time.Time                   // send time of the grant or last look-up of the keys on id that succeeded
	prev     time.Time                   // start of the previous batch (zero: none yet)
	gaps     [hbGapHistory]time.Duration // the last gaps between the starts of two batches, newest at gapNext-1
	gapNext  int                         // where the next gap goes in gaps
	beats    map[string]*hbBeat          // etcd key of each record this Backend refreshes → its state (a pointer: a look-up marks it without a string of its key)

	// hostsMu guards hosts, and is never held across a request, so that a
	// renewal records its look-up while a batch of this TTL is under way
	// (one that holds mu): with renewals and batches on the same grid (the
	// elector's defaults, both every TTL/2) it would otherwise be skipped
	// every time, and the records would leave the session and come back.
	hostsMu sync.Mutex
	hosts   map[clientv3.LeaseID]time.Time // session leases → when RenewBatch last looked their keys up (hostLookedUp)
}

// hbBeat is what a heartbeat session knows of one record.
type hbBeat struct {
	at      time.Time // when this Backend was last asked to refresh the record
	written bool      // the record is on the session lease: written by this Backend, or found there by the last look-up
}

// hbGapHistory is how many gaps between batches a heartbeat session
// remembers: it expects the next batch within the longest of them.
const hbGapHistory = 4

// hbSessionFor returns the heartbeat session of TTL secs, made on demand.
func (b *Backend) hbSessionFor(secs int64) *hbSession {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.hbSessions[secs]
	if s == nil {
		s = &hbSession{secs: secs, beats: make(map[string]*hbBeat), hosts: make(map[clientv3.LeaseID]time.Time)}
		b.hbSessions[secs] = s
	}
	return s
}

// hbSessionList returns the heartbeat sessions. A session's mu is never
// locked with b.mu held.
func (b *Backend) hbSessionList() []*hbSession {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*hbSession, 0, len(b.hbSessions))
	for _, s := range b.hbSessions {
		out = append(out, s)
	}
	return out
}

// forgetBeat makes the heartbeat session whose lease is id forget etcd key
// k, deleted from etcd (by RemoveMember): a later heartbeat of k writes it
// again, in its batch.
func (b *Backend) forgetBeat(id clientv3.LeaseID, k string) {
	for _, s := range b.hbSessionList() {
		s.mu.Lock()
		if s.on == id {
			delete(s.beats, k)
		}
		s.mu.Unlock()
	}
}

// nextGap records the start of a batch, now, and returns how soon the next
// batch is expected: the longest of the last hbGapHistory gaps between two
// batches, or 0 when none is known yet.
func (s *hbSession) nextGap(now time.Time) time.Duration {
	if !s.prev.IsZero() {
		s.gaps[s.gapNext] = now.Sub(s.prev)
		s.gapNext = (s.gapNext + 1) % hbGapHistory
	}
	s.prev = now
	var gap time.Duration
	for _, g := range s.gaps {
		gap = max(gap, g)
	}
	return gap
}

// HeartbeatBatch implements backend.BatchHeartbeater: the records of one
// TTL are attached to one etcd lease of this Backend (its heartbeat session
// of that TTL), and a batch sends at most two requests, at once, however
// many records it refreshes: a keep-alive of the session lease, and a
// look-up of the keys attached to it (no raft write); most batches of a
// steady caller send none, or one.
//
// A heartbeat session expects the next batch within the longest of the last
// four gaps between two batches (the caller's heartbeat interval, for an
// elector), and sends:
//
//   - the keep-alive only when the lease, counted from the send time of its
//     last keep-alive, would otherwise have less than a quarter of its TTL
//     left at the next batch: the lease is kept alive with at least a
//     quarter of its TTL to spare, and at most every three quarters of it
//     (for the elector's defaults, heartbeats every TTL/2 with records of
//     TTL+5 s: every 10 s at TTL 10 s instead of every 5 s; every 5 s at TTL
//     2 s instead of every second);
//   - the look-up only when the next batch would come more than the TTL
//     minus half a gap after the last look-up: at least once per TTL
//     (every 10 s at TTL 10 s, every 6 s at TTL 2 s).
//
// Between two look-ups a batch relies on what this Backend knows: it
// writes a record that it has not written on the current lease, and nothing
// else. The look-up repairs what others did: a record deleted by hand or by
// the RemoveMember of another Backend, or overwritten and attached to
// another lease, is written again by the first batch that looks up, so
// while batches keep their pace a live instance's record is missing for
// less than the TTL (it was at most one batch interval when every batch
// looked up): no longer than HeartbeatTTL, the elector's LeaderStale
// threshold. RemoveMember through this Backend takes effect at once: the
// next batch writes the record again. A lost lease (etcd restarted without
// its data, or the lease revoked by hand) is found by the next keep-alive or
// look-up, so within three quarters of its TTL; a new one is granted and
// every record of the batch written on it.
//
// The age of a record that Members and Record.HeartbeatAge report is the
// age of the session lease's last keep-alive: up to three quarters of its
// TTL for a live instance (it was at most one interval when every batch
// sent a keep-alive), always less than the TTL. A batch that sends nothing
// does not reach the store: it succeeds because the records live at least a
// quarter of their TTL beyond the next expected batch, by this Backend's
// last contact with the store. While the client's connection is not up
// (gRPC's Ready state), every batch sends the keep-alive, so a batch fails
// as before when the store cannot be reached instead of succeeding on what
// this Backend last knew; a store that stops answering on a connection that
// still looks up is found by the next keep-alive or look-up due.
//
// While this Backend holds keys on a session of plain acquisitions (see
// the package doc, "Sessions") whose TTL is no longer than the records'
// and whose keys RenewBatch has looked up within 0.6 of that TTL, the records
// ride on that session instead: they are moved to its lease (one
// transaction), and its renewals keep them alive and look them up, so a
// batch sends nothing but the rewrite of a record that a renewal's look-up
// found missing. An idle leader's heartbeats thus cost nothing on top of
// its renewals. Such a record ends with the session: within the session's
// TTL of the holder's last renewal, no later than HeartbeatTTL, and its age
// is that of the session's last keep-alive. This Backend never keeps a
// session alive for its heartbeats: that would keep its keys alive too.
// Once the keys are released (or the session is no longer renewed in
// batches, or has gone), the next batch moves the records back to the
// heartbeat session's own lease (a grant when it has expired meanwhile, and
// one transaction): for the elector's defaults about when the session ends
// (it outlives the release by at least half its TTL, its last renewal
// having been sent at most TTL/2 before; the next batch comes within
// TTL/2), otherwise the records are missing until that batch.
// When the renewals stop while the keys are still held (their holder
// stopped renewing them without a release, or this Backend cannot reach
// the store, when no batch could write a record either), the records end
// with the session and are missing until the first batch that finds the
// look-up 0.6 of a TTL old moves them: with heartbeats every TTL/2, for
// about a tenth of the TTL at most. Their absence is never taken as the
// holder's death. The bound is 0.6 rather than a half (which left no such
// gap) so that renewals every TTL/2 (an elector with RenewInterval TTL/2,
// the cadence of an etcd session's own keep-alives at TTL 2 s) keep the
// records on the session: at a half, a batch that came just before a
// renewal's look-up was recorded moved them back, and the next one onto
// the session again (107-123 requests a minute for an idle leader at TTL
// 2 s against 60-68; see bench/README.md).
//
// A record on the session that this Backend has not been asked to refresh
// for a TTL is deleted by the next batch (owner-checked: only while it is
// still on this session), so records of an instance that stopped
// heartbeating end within about a TTL although the session lives on; all of
// them end with the session lease, within its TTL of the last keep-alive,
// once this Backend stops heartbeating (it is closed, or its process died).
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
	start := time.Now()
	gap := s.nextGap(start)
	if host := b.hostSession(s, start); host != 0 {
		s.place(host)
		err := b.writeBeats(ctx, s, start, reqs, items)
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) || ctx.Err() != nil {
			return err
		}
		// The host session has gone: back on this session's own lease.
	}
	for attempt := 0; ; attempt++ {
		if err := s.refresh(ctx, b.cli, secs, start, gap); err != nil {
			return err
		}
		s.place(s.id)
		err := b.writeBeats(ctx, s, start, reqs, items)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && attempt == 0 && ctx.Err() == nil {
			continue // the lease has gone since its last keep-alive: a new one
		}
		return err
	}
}

// refresh keeps the session lease alive and looks up the keys attached to
// it when they are due (see HeartbeatBatch), for a batch started at start,
// the next one expected gap later (0: unknown, both are due). It grants a new
// lease when there is none, or when the current one has gone (by the local
// clock, the keep-alive or the look-up). It runs with s.mu held.
func (s *hbSession) refresh(ctx context.Context, cli *clientv3.Client, secs int64, start time.Time, gap time.Duration) error {
	ttl := time.Duration(s.ttl) * time.Second
	if s.id != 0 && start.Sub(s.lastSent) < ttl {
		needKA := gap == 0 || s.lastSent.Add(ttl).Sub(start.Add(gap)) < ttl/4
		needLook := gap == 0 || start.Sub(s.lastLook)+gap > ttl-gap/2
		if !needKA && !needLook && !ready(cli) {
			// Not connected: the keep-alive, not what this Backend last
			// knew, answers whether the store can be reached.
			needKA = true
		}
		var (
			look     *clientv3.LeaseTimeToLiveResponse
			kaErr    error
			lookErr  error
			kaSent   time.Time
			lookSent time.Time
			wg       sync.WaitGroup
			id       = s.id
		)
		if needLook {
			wg.Go(func() {
				lookSent = time.Now()
				look, lookErr = cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
			})
		}
		if needKA {
			kaSent = time.Now()
			_, kaErr = cli.KeepAliveOnce(ctx, id)
		}
		wg.Wait()
		if errors.Is(kaErr, rpctypes.ErrLeaseNotFound) || errors.Is(lookErr, rpctypes.ErrLeaseNotFound) ||
			needLook && lookErr == nil && look.TTL < 0 {
			s.id = 0 // expired, or revoked: grant a new one
		} else {
			if needKA && kaErr == nil {
				s.lastSent = kaSent
			}
			if needLook && lookErr == nil {
				s.looked(look.Keys, lookSent, start, true)
			}
			return errors.Join(kaErr, lookErr)
		}
	}
	s.id = 0
	sent := time.Now()
	grant, err := cli.Grant(ctx, secs)
	if err != nil {
		return fmt.Errorf("grant heartbeat session: %w", err)
	}
	s.id, s.ttl, s.lastSent, s.lastLook = grant.ID, grant.TTL, sent, sent
	clear(s.beats)
	return nil
}

// place puts the records of the session on lease on from this batch on:
// when it is another lease than the one they are on, each is written again
// (a put moves a key to the lease it names). It runs with s.mu held.
func (s *hbSession) place(on clientv3.LeaseID) {
	if s.on == on {
		return
	}
	s.on = on
	for _, beat := range s.beats {
		beat.written = false
	}
}

// hostSession returns the lease of a session of plain acquisitions that
// the records of s can ride on at now, or 0: a session of a TTL no longer
// than the records', on which this Backend holds keys (their holds renew
// it until they release them), whose keys RenewBatch looked up less than
// 0.6 of its TTL ago (hostLookedUp; see HeartbeatBatch for the bound). Its renewals keep the records alive and
// look them up, so they cost nothing of their own; this Backend never keeps
// a session alive for its heartbeats (that would keep its keys alive too).
// It runs with s.mu held.
func (b *Backend) hostSession(s *hbSession, now time.Time) clientv3.LeaseID {
	var best clientv3.LeaseID
	var bestTTL int64
	for _, ps := range b.sessionList() {
		ps.mu.Lock()
		id, ttl := ps.id, ps.ttl
		ps.mu.Unlock()
		s.hostsMu.Lock()
		looked, ok := s.hosts[id]
		s.hostsMu.Unlock()
		if id == 0 || !ok || ttl > s.secs || ttl <= bestTTL || now.Sub(looked) >= time.Duration(ttl)*time.Second*6/10 {
			continue
		}
		b.mu.Lock()
		held := len(b.owned[id]) > 0
		b.mu.Unlock()
		if held {
			best, bestTTL = id, ttl
		}
	}
	s.hostsMu.Lock()
	for id, at := range s.hosts {
		if now.Sub(at) >= time.Duration(s.secs)*time.Second {
			delete(s.hosts, id)
		}
	}
	s.hostsMu.Unlock()
	return best
}

// hostLookedUp takes the look-up of the keys attached to session lease id
// that RenewBatch made as the look-up of the heartbeat records riding on it.
// With covered, RenewBatch made none, the watch having delivered no change
// of a heartbeat record since the last one (coveredRenewal): what the
// records' session knows of them stands. It records the look-up's time in
// every heartbeat session (hostsMu, held for no request), but marks the
// records looked up only in one whose batch is not under way (the next
// renewal will do), so a renewal never waits for a heartbeat batch.
func (b *Backend) hostLookedUp(id clientv3.LeaseID, keys [][]byte, covered bool) {
	ss := b.hbSessionList()
	if len(ss) == 0 {
		return // no heartbeats here: nothing rides on the session
	}
	var hb [][]byte
	for _, k := range keys {
		if bytes.Contains(k, heartbeatInfixBytes) {
			hb = append(hb, k)
		}
	}
	now := time.Now()
	for _, s := range ss {
		s.hostsMu.Lock()
		s.hosts[id] = now
		s.hostsMu.Unlock()
		if !s.mu.TryLock() {
			continue
		}
		if s.on == id && !covered {
			// Keys not refreshed here may be another heartbeat session's
			// (of another TTL) riding on the same session: not adopted.
			s.looked(hb, now, now, false)
		}
		s.mu.Unlock()
	}
}

// ready reports whether cli's connection is up (gRPC's Ready state).
func ready(cli *clientv3.Client) bool {
	conn := cli.ActiveConnection()
	return conn != nil && conn.GetState() == connectivity.Ready
}

// looked records a look-up of the keys attached to the lease the records are
// on, sent at sent during the batch started at start: a record this Backend
// refreshes is written again unless it is among them. With adopt (the
// session's own lease, which holds only its records), a key among them that
// this Backend does not refresh (a transaction whose outcome was unknown, a
// RemoveMember racing a batch) is deleted unless refreshed within a TTL. It
// runs with s.mu held. It makes no string of a key it looks up (only of one
// it adopts), and no map: a look-up of 10,000 records costs no allocation.
func (s *hbSession) looked(keys [][]byte, sent, start time.Time, adopt bool) {
	s.lastLook = sent
	for _, beat := range s.beats {
		beat.written = false
	}
	for _, k := range keys {
		if beat := s.beats[string(k)]; beat != nil {
			beat.written = true
		} else if adopt {
			s.beats[string(k)] = &hbBeat{at: start, written: true}
		}
	}
}

// writeBeats writes the records of reqs[i], i in items, that are not on the
// session lease, and deletes (owner-checked) those this Backend has not been
// asked to refresh for a TTL, in transactions of up to txnBatchOps
// operations. It runs with s.mu held.
func (b *Backend) writeBeats(ctx context.Context, s *hbSession, start time.Time, reqs []backend.HeartbeatRequest, items []int) error {
	type change struct {
		k   string
		put bool // put: written once committed; else: forgotten once committed
	}
	var (
		ops     []clientv3.Op
		changes []change
		queued  = make(map[string]bool)
	)
	for _, i := range items {
		r := reqs[i]
		k := b.heartbeatKey(r.Key, r.ID)
		beat := s.beats[k]
		if beat == nil {
			beat = &hbBeat{}
			s.beats[k] = beat
		}
		beat.at = start
		if beat.written || queued[k] {
			continue // a key twice in one batch is written once
		}
		value, err := json.Marshal(heartbeatBody{ID: r.ID, At: start, Session: true})
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(k, string(value), clientv3.WithLease(s.on)))
		changes = append(changes, change{k, true})
		queued[k] = true
	}
	stale := time.Duration(max(s.ttl, s.secs)) * time.Second
	for k, beat := range s.beats {
		if start.Sub(beat.at) < stale {
			continue
		}
		if !beat.written {
			delete(s.beats, k)
			continue
		}
		// Deleted only while still on this session: a record written
		// since by anyone else stays.
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", s.on)},
			[]clientv3.Op{clientv3.OpDelete(k)}, nil))
		changes = append(changes, change{k, false})
	}
	for len(ops) > 0 {
		n := min(len(ops), txnBatchOps)
		if _, err := b.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				if s.on == s.id {
					s.id = 0
				}
				s.on = 0
			} else {
				// The transaction may have committed: the next batch
				// looks the keys up.
				s.lastLook = time.Time{}
			}
			return err
		}
		for _, c := range changes[:n] {
			if c.put {
				beat := s.beats[c.k]
				if beat == nil {
					beat = &hbBeat{}
					s.beats[c.k] = beat
				}
				beat.written = true
			} else {
				delete(s.beats, c.k)
			}
		}
		ops, changes = ops[n:], changes[n:]
	}
	return nil
}

// txnBatchOps is the most operations one transaction of HeartbeatBatch
// carries: etcd's default --max-txn-ops.
const txnBatchOps = 128
