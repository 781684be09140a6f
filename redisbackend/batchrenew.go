package redisbackend

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
)

var (
	_ backend.BatchRenewer     = (*Backend)(nil)
	_ backend.BatchHeartbeater = (*Backend)(nil)
	_ backend.AcquireConfirmer = (*Backend)(nil)
	_ backend.RenewalWatcher   = (*Backend)(nil)
	_ backend.RenewalMuter     = (*Backend)(nil)
)

// maxBatchKeys bounds the items (leases or heartbeats) one batch script
// serves, so that a script never blocks the server for long: about 4 µs of
// server CPU a renewal, 8 with its heartbeat refresh, 5 a heartbeat
// (BenchmarkBatchServerCPU), so 2 ms at most.
const maxBatchKeys = 256

// renewManyScript renews many leases, each exactly as renewScript does
// (owner check, PEXPIRE, and HSET of ttl only when it changes; keep the
// two in step), and refreshes the heartbeat record of a lease's holder
// when asked to.
// Its arguments (A) are holder, token, ttl ms and heartbeat ttl ms for
// each lease in turn, then, optionally, the publish command: each renewal
// is then published as renewScript publishes it; its keys (K) are, for
// each lease in turn, its key and, when its heartbeat ttl is not 0, its
// holder's heartbeat record and the members set: in KEYS, all of one hash
// slot (renewManyScript), or on a Cluster all served by one master
// (renewManyNodeScript; see nodebatch.go for how they are passed). It
// returns one status per lease: OK (renewed), OKH (renewed, and the
// heartbeat refreshed), LOST, an array of WRONGTYPE, the key and a
// description of the foreign data found, or, in a master's script only,
// MOVED (the master does not serve the key).
//
// The heartbeat refresh writes the record as heartbeatManyScript does
// (PEXPIRE, and HSET of at and ttl only when the TTL changes; keep the two
// in step), with these differences: it runs only after the
// lease's owner check passed, and only on a record that is there and is
// one of ours (a hash with the fields at and ttl); otherwise it writes
// nothing and the lease's status is OK, so a missing record is never
// created here (HeartbeatBatch writes it) and foreign data is never
// touched (HeartbeatBatch reports it). And it leaves the members set alone
// while the set has at least the record's TTL left; otherwise it adds the
// holder (which fails on foreign data: then nothing is written) and
// extends the set to twice the record's TTL. The set therefore outlives
// its last record by at most one heartbeat TTL, and a refresh costs three
// calls (HMGET, PTTL, PEXPIRE) most of the time.
//
// Server CPU a renewal (BenchmarkRenewVariantsServerCPU: 1,024 leases in 4
// scripts, interleaved with the script before renewals stopped writing
// renewed_at and at, on one redis-server 7.0; load average 3 on 2 cores,
// 2026-11-23): 3.2 µs against 3.9 before, PEXPIRE alone (no owner check)
// 1.6; with the heartbeat refresh 6.9 against 7.8. Of the 0.7 µs saved,
// about 0.3 is the writes (HSET, TIME) and 0.4 the owner check's reading
// one field fewer (modes, read only when the lease is not the caller's)
// with the common case tested first. What is left is the calls themselves
// and the strings they return: the owner check reads four fields (an HMGET
// of holder and token alone measures 2.5 µs with its PEXPIRE, an HGET of
// the token alone 2.1), and the refresh makes three calls (HMGET, PTTL,
// PEXPIRE).
var (
	renewManyScript     = redis.NewScript(luaBase + slotLua(renewManyLua))
	renewManyNodeScript = redis.NewScript(luaBase + nodeKeys + luaNotHere + nodeLua(renewManyLua))
)

// renewManyLua is the body of renewManyScript and renewManyNodeScript: $K
// are its keys, $A its arguments (see slotLua and nodeLua).
const renewManyLua = `
local out = {}
local now
local k = 0
local pub = ''
if $nA % 4 == 1 then pub = $A[$nA] end
for i = 1, math.floor($nA / 4) do
  local a = (i - 1) * 4
  local holder, token, ttl, hbttl = $A[a + 1], $A[a + 2], $A[a + 3], $A[a + 4]
  k = k + 1
  local lk, hk, mk = $K[k], nil, nil
  if hbttl ~= '0' then
    hk, mk = $K[k + 1], $K[k + 2]
    k = k + 2
  end
  -- The common case first, with the fewest fields: every string read
  -- costs (a Lua string made of it), about 0.5 µs of a 3 to 4 µs renewal.
  local f = redis.pcall('HMGET', lk, 'holder', 'token', 'term', 'ttl')
  if f[1] == holder and f[2] == token and tonumber(f[3] or '') then
    redis.call('PEXPIRE', lk, ttl)
    if f[4] ~= ttl then redis.call('HSET', lk, 'ttl', ttl) end
    if pub ~= '' then redis.call(pub, lk .. ':renewals', 'renewed:' .. f[3] .. ':' .. ttl) end
    out[i] = 'OK'
    if hk then
      -- The holder's record, when it is there and ours (an error reply,
      -- for foreign data, has no [1] either). The members set must
      -- outlive it: when the set has less than the record's TTL left,
      -- SADD (which fails on foreign data, writing nothing) and extend
      -- it to twice that TTL, so that most refreshes leave it alone.
      local v = redis.pcall('HMGET', hk, 'at', 'ttl')
      if tonumber(v[1] or '') and tonumber(v[2] or '') then
        local hbms = tonumber(hbttl)
        local covered = redis.call('PTTL', mk) >= hbms
        if not covered and not failed(redis.pcall('SADD', mk, holder)) then
          redis.call('PEXPIRE', mk, fmt(2 * hbms))
          covered = true
        end
        if covered then
          if v[2] ~= hbttl then
            now = now or fmt(now_ms())
            redis.call('HSET', hk, 'at', now, 'ttl', hbttl)
          end
          redis.call('PEXPIRE', hk, hbttl)
          out[i] = 'OKH'
        end
      end
    end
  elseif $moved(f) then
    out[i] = 'MOVED' -- not on this node: sent again, by slot
  elseif failed(f) then
    out[i] = {'WRONGTYPE', lk, 'a ' .. ktype(lk)}
  elseif f[1] and f[2] and tonumber(f[3] or '') then
    out[i] = 'LOST' -- the lease of another acquisition
  elseif not f[1] and redis.call('HGET', lk, 'modes') == '1' then
    out[i] = 'LOST' -- entries of backend.Modes, as in check_owner
  elseif f[1] or f[2] or f[3] or redis.call('EXISTS', lk) == 1 then
    out[i] = {'WRONGTYPE', lk, no_lease_fields}
  else
    out[i] = 'LOST'
  end
end
return out
`

// heartbeatManyScript records many heartbeats, each exactly as
// heartbeatScript does (keep the two in step). Its keys (K) are, for each
// heartbeat in turn, its record and its members set, all of one hash slot
// (or one master: heartbeatManyNodeScript, as for renewManyScript); its
// arguments (A) are id and ttl ms for each. It returns one status per
// heartbeat: OK, an array of WRONGTYPE, the key and a description, or, in
// a master's script only, MOVED.
var (
	heartbeatManyScript     = redis.NewScript(luaBase + slotLua(heartbeatManyLua))
	heartbeatManyNodeScript = redis.NewScript(luaBase + nodeKeys + luaNotHere + nodeLua(heartbeatManyLua))
)

// heartbeatManyLua is the body of heartbeatManyScript and
// heartbeatManyNodeScript: $K are its keys, $A its arguments.
const heartbeatManyLua = `
local out = {}
local now
for i = 1, $nK / 2 do
  local hk, mk = $K[2 * i - 1], $K[2 * i]
  local id, ttl = $A[2 * i - 1], $A[2 * i]
  local v = redis.pcall('HMGET', hk, 'at', 'ttl')
  if $moved(v) then
    out[i] = 'MOVED' -- not on this node: sent again, by slot
  elseif failed(v) then
    out[i] = {'WRONGTYPE', hk, 'a ' .. ktype(hk)}
  elseif not (tonumber(v[1] or '') and tonumber(v[2] or '')) and
      (v[1] or v[2] or redis.call('EXISTS', hk) == 1) then
    out[i] = {'WRONGTYPE', hk, 'a hash without the fields at and ttl'}
  elseif failed(redis.pcall('SADD', mk, id)) then
    out[i] = {'WRONGTYPE', mk, 'a ' .. ktype(mk)}
  else
    if v[2] ~= ttl then
      now = now or fmt(now_ms())
      redis.call('HSET', hk, 'at', now, 'ttl', ttl)
    end
    redis.call('PEXPIRE', hk, ttl)
    if redis.call('PTTL', mk) < tonumber(ttl) then
      redis.call('PEXPIRE', mk, ttl)
    end
    out[i] = 'OK'
  end
end
return out
`

// RenewBatch implements backend.BatchRenewer: one script per 256 keys on a
// single server, and on a Cluster one per 256 keys served by one master
// (nodebatch.go: the keys a master turns out not to serve go again, by
// hash slot), all sent in one pipeline (on a Cluster, one round trip per
// master, and one more for keys sent again). Leases of Modes
// entries, and every lease when WaitReplicas is set (a renewal then waits
// for replicas), are renewed one by one with Renew.
//
// A renewal also covers its holder's heartbeat: when HeartbeatBatch of
// this Backend keeps writing the record of the lease's holder ID for the
// lease's key (the elector's heartbeat of a leader), the script that renews
// the lease refreshes that record too (its at, its TTL, the members set's
// expiry) if it is there and is ours, and HeartbeatBatch then finds it
// fresh and sends nothing for it: an idle leader sends its renewals and no
// heartbeat. A record found missing or foreign is left alone and the next
// HeartbeatBatch writes (or reports) it.
func (b *Backend) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	errs := make([]error, len(leases))
	if err := b.begin(ctx); err != nil {
		fill(errs, err)
		return errs
	}
	b.renewBatch(ctx, leases, errs, b.cluster != nil)
	return errs
}

// renewBatch is RenewBatch, writing each lease's error in errs; byNode (on
// a Cluster) sends one script per master, then the items it must send
// again by slot (see nodebatch.go).
func (b *Backend) renewBatch(ctx context.Context, leases []backend.Lease, errs []error, byNode bool) {
	var (
		calls  []batchScriptCall
		groups = map[int]int{}                      // group (groupTag, nodeTagger) → index in calls of its open group
		hbTTLs = make([]time.Duration, len(leases)) // the TTL of the holder's heartbeat record refreshed, or 0
		ms     msCache
		buf    []byte
		nodes  *nodeTagger
	)
	if byNode {
		nodes = b.newNodeTagger(ctx)
	}
	now := time.Now() // before sending: a record refreshed lives its TTL from at least now
	for i, l := range leases {
		if l.Entry != nil || b.waitN > 0 {
			errs[i] = b.Renew(ctx, l)
			continue
		}
		if err := b.validateLease(l); err != nil {
			errs[i] = err
			continue
		}
		// One string holds the lease's key and, when the holder's record
		// is refreshed, the record's and the members set's: the key of
		// the record and the lease's key are prefixes of it, the set's
		// key its end.
		buf = b.appendKeyBase(buf[:0], l.Key)
		base := len(buf)
		ttl, hb := b.beats.renewal(beatKey{l.Key, l.HolderID}, now)
		var keys string
		var rec int // end of the record's key in keys
		if hb {
			buf = append(buf, ":heartbeat:"...)
			buf = append(buf, l.HolderID...)
			rec = len(buf)
			buf = b.appendKeyBase(buf, l.Key)
			buf = append(buf, ":members"...)
		}
		keys = string(buf)
		tag := b.groupTag(keys[:base])
		if nodes != nil {
			tag = nodes.tag(keys[:base])
		}
		g := group(calls, groups, tag)
		if g < 0 {
			g = len(calls)
			calls = append(calls, b.newBatchScriptCall(len(leases)-i, 3, 4, tag >= nodeTag))
			groups[tag] = g
		}
		c := &calls[g]
		c.keys = append(c.keys, keys[:base])
		hbTTL := "0"
		if hb {
			hbTTLs[i] = ttl
			c.keys = append(c.keys, keys[:rec], keys[rec:])
			hbTTL = ms.of(ttl)
		}
		c.args = append(c.args, l.HolderID, l.Token, ms.of(l.TTL), hbTTL)
		c.items = append(c.items, i)
	}
	if b.publishCmd != "" {
		for i := range calls {
			calls[i].args = append(calls[i].args, b.publishCmd)
		}
	}
	b.runBatch(ctx, renewManyScript, renewManyNodeScript, calls, func(i int, reply any, err error) {
		l := leases[i]
		if err != nil {
			errs[i] = fmt.Errorf("redisbackend: renew %q: %w", l.Key, err)
			return
		}
		switch status, err := itemStatus("renew", l.Key, reply); {
		case err != nil:
			errs[i] = err
		case status == "OKH":
			b.beats.refreshed(beatKey{l.Key, l.HolderID}, hbTTLs[i], now)
		case status == "OK":
			if hbTTLs[i] != 0 {
				b.beats.forget(beatKey{l.Key, l.HolderID}) // missing or foreign: HeartbeatBatch sees to it
			}
		case status == "LOST":
			errs[i] = fmt.Errorf("redisbackend: renew %q (term %d): %w", l.Key, l.Term, backend.ErrLeaseLost)
		case status == movedStatus:
			errs[i] = errMovedItem
		default:
			errs[i] = fmt.Errorf("redisbackend: renew %q: unexpected reply %q", l.Key, status)
		}
	})
	if again := resent(calls, errs); len(again) > 0 {
		sub, subErrs := make([]backend.Lease, len(again)), make([]error, len(again))
		for j, i := range again {
			sub[j] = leases[i]
		}
		b.renewBatch(ctx, sub, subErrs, false)
		for j, i := range again {
			errs[i] = subErrs[j]
		}
	}
}

// HeartbeatBatch implements backend.BatchHeartbeater like RenewBatch: one
// script per 256 heartbeats (on a Cluster, of one master), all in one
// pipeline.
func (b *Backend) HeartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest) []error {
	errs := make([]error, len(reqs))
	if err := b.begin(ctx); err != nil {
		fill(errs, err)
		return errs
	}
	b.heartbeatBatch(ctx, reqs, errs, b.cluster != nil)
	return errs
}

// heartbeatBatch is HeartbeatBatch, writing each request's error in errs;
// byNode as for renewBatch.
func (b *Backend) heartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest, errs []error, byNode bool) {
	var (
		calls  []batchScriptCall
		groups = map[int]int{}
		ms     msCache
		buf    []byte
		nodes  *nodeTagger
	)
	if byNode {
		nodes = b.newNodeTagger(ctx)
	}
	now := time.Now() // before sending: a record written lives TTL from at least now
	for i, r := range reqs {
		if err := backend.ValidateHeartbeat(r.Key, r.ID, r.TTL); err != nil {
			errs[i] = err
			continue
		}
		if err := b.ValidateKey(r.Key); err != nil {
			errs[i] = err
			continue
		}
		if b.beats.fresh(beatKey{r.Key, r.ID}, r.TTL, now) {
			continue // the record outlives the next batch by a quarter of its TTL
		}
		// The record's key and the members set's, in one string.
		buf = b.appendKeyBase(buf[:0], r.Key)
		buf = append(buf, ":heartbeat:"...)
		buf = append(buf, r.ID...)
		rec := len(buf)
		buf = b.appendKeyBase(buf, r.Key)
		buf = append(buf, ":members"...)
		keys := string(buf)
		tag := b.groupTag(keys[:rec])
		if nodes != nil {
			tag = nodes.tag(keys[:rec])
		}
		g := group(calls, groups, tag)
		if g < 0 {
			g = len(calls)
			calls = append(calls, b.newBatchScriptCall(len(reqs)-i, 2, 2, tag >= nodeTag))
			groups[tag] = g
		}
		c := &calls[g]
		c.keys = append(c.keys, keys[:rec], keys[rec:])
		c.args = append(c.args, r.ID, ms.of(r.TTL))
		c.items = append(c.items, i)
	}
	b.runBatch(ctx, heartbeatManyScript, heartbeatManyNodeScript, calls, func(i int, reply any, err error) {
		r := reqs[i]
		bk := beatKey{r.Key, r.ID}
		if err != nil {
			b.beats.forget(bk)
			errs[i] = fmt.Errorf("redisbackend: heartbeat %q for %q: %w", r.ID, r.Key, err)
			return
		}
		switch status, err := itemStatus("heartbeat", r.Key, reply); {
		case err != nil:
			b.beats.forget(bk)
			errs[i] = err
		case status == "OK":
			b.beats.wrote(bk, r.TTL, now)
		case status == movedStatus:
			b.beats.forget(bk)
			errs[i] = errMovedItem
		default:
			b.beats.forget(bk)
			errs[i] = fmt.Errorf("redisbackend: heartbeat %q for %q: unexpected reply %q", r.ID, r.Key, status)
		}
	})
	if again := resent(calls, errs); len(again) > 0 {
		sub, subErrs := make([]backend.HeartbeatRequest, len(again)), make([]error, len(again))
		for j, i := range again {
			sub[j] = reqs[i]
		}
		b.heartbeatBatch(ctx, sub, subErrs, false)
		for j, i := range again {
			errs[i] = subErrs[j]
		}
	}
}

// appendKeyBase appends b.keyBase(key) to dst (keep the two in step), so
// that the keys of a batch item are built in one string.
func (b *Backend) appendKeyBase(dst []byte, key string) []byte {
	dst = append(dst, b.prefix...)
	dst = append(dst, '{')
	rest, ok := strings.CutPrefix(key, backend.LockKeyPrefix)
	if !ok {
		dst = append(dst, key...)
		return append(dst, '}')
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		i = len(rest)
	}
	dst = append(dst, backend.LockKeyPrefix...)
	dst = append(dst, rest[:i]...)
	dst = append(dst, "}{"...)
	dst = append(dst, rest[i:]...)
	return append(dst, '}')
}

// msCache formats TTLs as script arguments (whole milliseconds, rounded up),
// remembering the last one: the items of a batch mostly share their TTL.
type msCache struct {
	d time.Duration
	s string
}

func (c *msCache) of(d time.Duration) string {
	if c.s == "" || d != c.d {
		c.d, c.s = d, strconv.FormatInt(ttlMillis(d), 10)
	}
	return c.s
}

// beats is what HeartbeatBatch knows of the records it wrote, so that a
// batch writes only the records that need it: a record that will still have
// more than a quarter of its TTL left at the next batch (expected after as
// long as the last gap between two batches asking for it) is left alone.
// With the elector's defaults (a batch every 5 s, records of 15 s) each
// record is written every 10 s instead of every 5 s. A record removed
// through this Backend (RemoveMember) is written by the next batch; one lost
// otherwise (RemoveMember by another instance, a restart without data) is
// written again within three quarters of its TTL.
//
// RenewBatch refreshes, with the lease of the same key and holder ID, the
// records that batches keep asking for when a batch would otherwise write
// them (renewal), and notes it (refreshed): a leader's record is then
// fresh at every batch, and its heartbeat batches send nothing. A renewal
// that finds the record missing or foreign forgets it, so that the next
// batch writes it.
type beats struct {
	mu    sync.Mutex
	m     map[beatKey]beat // record → its last write
	swept time.Time
}

// beatKey names a heartbeat record: the ID's record for the key. Made of the
// request's own strings, it costs no allocation to look up.
type beatKey struct {
	key, id string
}

type beat struct {
	written time.Time     // send time of the batch that last wrote the record
	asked   time.Time     // time of the last batch that asked for it
	gap     time.Duration // between the last two batches that asked for it
	ttl     time.Duration
	renewed time.Time // time of the last renewal that looked at it (RenewBatch)
}

// fresh reports whether the record at key, asked for again at now, can be
// left alone; it notes the request either way.
func (s *beats) fresh(key beatKey, ttl time.Duration, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(now)
	bt, ok := s.m[key]
	if !ok || bt.ttl != ttl {
		return false
	}
	bt.gap = now.Sub(bt.asked)
	bt.asked = now
	s.m[key] = bt
	nextBatch := now.Add(bt.gap)
	return bt.written.Add(ttl).Sub(nextBatch) > ttl/4
}

// wrote notes that a batch sent at sent wrote the record at key.
func (s *beats) wrote(key beatKey, ttl time.Duration, sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[beatKey]beat)
	}
	bt := s.m[key]
	if !bt.asked.IsZero() {
		bt.gap = sent.Sub(bt.asked)
	}
	bt.written, bt.asked, bt.ttl = sent, sent, ttl
	s.m[key] = bt
}

// renewal reports whether a renewal at now should refresh the record at
// key, and with which TTL; it notes the renewal either way. It refreshes
// only a record that batches keep asking for (the last one did within one
// and a half gaps between batches, or half its TTL if that is longer): a
// record nobody asks for any more (its instance stopped heartbeating for
// the key) is not kept alive by renewals. And it refreshes only when a
// batch expected before the next renewal (as far off as the last one was,
// a quarter late at most; batches an eighth of a gap late) would otherwise
// write it, rather than at every renewal: at the elector's defaults 12
// refreshes a minute out of 18 renewals (TTL 10 s), 15 out of 90 (TTL
// 2 s), where the batches alone would write 6 and 12 (see
// TestBeatsRenewalsCoverBatches). Batches keep their rule (fresh): if
// renewals stop, they write the record before it runs short, as they
// would without renewals.
func (s *beats) renewal(key beatKey, now time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bt, ok := s.m[key]
	if !ok || now.Sub(bt.asked) > max(bt.gap+bt.gap/2, bt.ttl/2) {
		return 0, false
	}
	prev := bt.renewed
	bt.renewed = now
	s.m[key] = bt
	pace := now.Sub(prev)
	if prev.IsZero() || bt.gap <= 0 || pace <= 0 || pace > bt.ttl {
		return bt.ttl, true // pace unknown
	}
	next := now.Add(pace + pace/4)
	// Batches are expected at asked + k·gap; last is the latest one before
	// next, an eighth of a gap late.
	if !bt.asked.Add(bt.gap).Before(next) {
		return bt.ttl, false // no batch before the next renewal
	}
	k := next.Sub(bt.asked) / bt.gap
	last := bt.asked.Add(k*bt.gap + bt.gap/8)
	if last.After(next) {
		last = next
	}
	stale := bt.written.Add(bt.ttl).Sub(last.Add(bt.gap)) <= bt.ttl/4 // as in fresh
	return bt.ttl, stale
}

// refreshed notes that a renewal sent at sent refreshed the record at key
// with ttl. It changes nothing when batches ask for the record with
// another TTL or forgot it meanwhile.
func (s *beats) refreshed(key beatKey, ttl time.Duration, sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bt, ok := s.m[key]
	if !ok || bt.ttl != ttl || !sent.After(bt.written) {
		return
	}
	bt.written = sent
	s.m[key] = bt
}

// forget makes the next batch write the record at key.
func (s *beats) forget(key beatKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

// sweep drops, about once a minute, the records nobody asked for during
// twice their TTL (an instance that stopped).
func (s *beats) sweep(now time.Time) {
	if now.Sub(s.swept) < time.Minute {
		return
	}
	s.swept = now
	for k, bt := range s.m {
		if now.Sub(bt.asked) > 2*bt.ttl {
			delete(s.m, k)
		}
	}
}

// batchScriptCall is one script of a batch: the keys of one hash slot (or,
// node, of one Cluster master) and the batch items (indexes into the
// caller's slice) they serve, in order.
// Its arguments are strings, passed to go-redis by pointer (see evalSha).
type batchScriptCall struct {
	keys  []string
	args  []string
	items []int
	node  bool // one Cluster master's call (nodeLua): keys[0] in KEYS, and every key in ARGV
}

// newBatchScriptCall returns a call with room for the keys and arguments of
// up to n items (at most maxBatchKeys), of k keys and a arguments each. On
// a Cluster a call of one hash slot (not node: the keys a master did not
// serve, sent again) holds few of a batch's keys (10,000 keys fall in
// about 7,500 of the 16,384 slots), so it starts with
// room for clusterCallRoom items and grows as needed: room for every item
// left in the batch, made for each slot, was most of a Cluster client's
// garbage (about 30 KiB a call) when every call served one slot.
func (b *Backend) newBatchScriptCall(n, k, a int, node bool) batchScriptCall {
	n = min(n, maxBatchKeys)
	if b.cluster != nil && !node {
		n = min(n, clusterCallRoom)
	}
	return batchScriptCall{
		keys:  make([]string, 0, n*k),
		args:  make([]string, 0, n*a),
		items: make([]int, 0, n),
		node:  node,
	}
}

// clusterCallRoom is the number of items a Cluster's batch call has room
// for when made (see newBatchScriptCall).
const clusterCallRoom = 4

// evalSha returns the EVALSHA command of s for c. Its keys and arguments go
// in as pointers into c's slices, which go-redis writes (and reads for a
// Cluster's slot) as the strings they point to: a pointer in an interface
// costs no allocation, where each string would cost one.
func (c *batchScriptCall) evalSha(ctx context.Context, s *redis.Script) *redis.Cmd {
	argv := make([]any, 0, 5+2*len(c.keys)+len(c.args))
	if c.node {
		argv = append(argv, "evalsha", s.Hash(), 1, &c.keys[0], len(c.keys))
		for i := range c.keys {
			argv = append(argv, &c.keys[i])
		}
	} else {
		argv = append(argv, "evalsha", s.Hash(), len(c.keys))
		for i := range c.keys {
			argv = append(argv, &c.keys[i])
		}
	}
	for i := range c.args {
		argv = append(argv, &c.args[i])
	}
	cmd := redis.NewCmd(ctx, argv...)
	if len(c.keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// eval returns the EVAL command of s for c, for a server that does not know
// the script (NOSCRIPT).
func (c *batchScriptCall) eval(ctx context.Context, p redis.Pipeliner, s *redis.Script) *redis.Cmd {
	keys := c.keys
	args := make([]any, 0, len(c.keys)+len(c.args))
	if c.node {
		keys = c.keys[:1]
		args = append(args, len(c.keys))
		for _, k := range c.keys {
			args = append(args, k)
		}
	}
	for _, a := range c.args {
		args = append(args, a)
	}
	return s.Eval(ctx, p, keys, args...)
}

// groupTag is what decides a key's placement: its hash slot on a Cluster
// (keys with different hash tags may share a slot, and one script may
// touch every key of a slot), and nothing (one group, -1) on a single
// server.
func (b *Backend) groupTag(key string) int {
	if b.cluster == nil {
		return -1
	}
	return int(keySlot(key))
}

// keySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash
// tag (the part between the first '{' and the next '}', when not empty) or
// of the whole key, modulo 16384. It runs for every key of every batch on
// a Cluster, so the CRC is table-driven (crc16Table): a byte a step, not a
// bit (bit by bit it was 5 % of a Cluster client's CPU holding 100,000
// locks).
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[k]]
	}
	return crc % 16384
}

// crc16Table is the CRC16 (XMODEM, polynomial 0x1021) of every byte value.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// group returns the index in calls of the open group of tag (groupTag),
// or -1 when there is none or it is full (maxBatchKeys items).
func group(calls []batchScriptCall, groups map[int]int, tag int) int {
	g, ok := groups[tag]
	if !ok || len(calls[g].items) >= maxBatchKeys {
		return -1
	}
	return g
}

// runBatch sends calls as one pipeline of EVALSHA, then, in a second
// pipeline, EVAL for each call whose script the server did not know
// (NOSCRIPT: after SCRIPT FLUSH or a restart), as evalPipeline does, and
// reports each item's status.
func (b *Backend) runBatch(ctx context.Context, s, node *redis.Script, calls []batchScriptCall, report func(item int, reply any, err error)) {
	if len(calls) == 0 {
		return
	}
	replies := make([][]any, len(calls))
	callErrs := make([]error, len(calls))
	err := b.bounded(ctx, func(ctx context.Context) error {
		cmds := make([]*redis.Cmd, len(calls))
		p := b.client.Pipeline()
		script := func(c *batchScriptCall) *redis.Script {
			if c.node {
				return node
			}
			return s
		}
		for i := range calls {
			cmds[i] = calls[i].evalSha(ctx, script(&calls[i]))
			_ = p.Process(ctx, cmds[i])
		}
		_, _ = p.Exec(ctx)
		var retry redis.Pipeliner
		for i, cmd := range cmds {
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				if retry == nil {
					retry = b.client.Pipeline()
				}
				cmds[i] = calls[i].eval(ctx, retry, script(&calls[i]))
			}
		}
		if retry != nil {
			_, _ = retry.Exec(ctx)
		}
		for i, cmd := range cmds {
			v, err := cmd.Result()
			if err != nil {
				callErrs[i] = err
				continue
			}
			arr, ok := v.([]any)
			if !ok || len(arr) != len(calls[i].items) {
				callErrs[i] = fmt.Errorf("unexpected batch reply %#v", v)
				continue
			}
			replies[i] = arr
		}
		return nil
	})
	for i, c := range calls {
		for j, item := range c.items {
			switch {
			case err != nil:
				report(item, nil, err)
			case callErrs[i] != nil:
				report(item, nil, callErrs[i])
			default:
				report(item, replies[i][j], nil)
			}
		}
	}
}

// itemStatus reads one item's reply of a batch script: a status string, or
// a WRONGTYPE array turned into the error checkStatus makes of it.
func itemStatus(op, key string, reply any) (string, error) {
	if arr, ok := reply.([]any); ok && len(arr) > 0 {
		return checkStatus(op, key, arr)
	}
	return str(reply), nil
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// AcquireConfirms implements backend.AcquireConfirmer: the acquire script
// writes the lease and answers with it in one atomic step on the primary
// (with WaitReplicas, once the replicas confirmed the write), which is what
// a read right after it would return from that primary.
func (b *Backend) AcquireConfirms() bool { return true }
