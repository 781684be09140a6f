package etcdbackend

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
)

// recordBody is the JSON part of a lease record's value.
type recordBody struct {
	AcquiredAt time.Time         `json:"acquired_at"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// Mode and Limit are those of an entry of backend.Modes (absent for a
	// lease from Acquire: Exclusive, no limit).
	Mode  backend.Mode `json:"mode,omitempty"`
	Limit int          `json:"limit,omitempty"`
	// Key is, in an intent, the key of the lock below that holds it.
	Key string `json:"key,omitempty"`
}

// recordHeader is the first line of a lease record's value: the token and
// the quoted holder ID. Renew and Release compare the stored value against
// it, so they check token and holder inside the transaction.
func recordHeader(token, holderID string) string {
	return token + " " + strconv.Quote(holderID) + "\n"
}

// encodeRecord returns the value of a lease record.
func encodeRecord(token, holderID string, body recordBody) (string, error) {
	v, err := appendRecord(nil, token, holderID, body)
	return string(v), err
}

// appendRecord appends the value of a lease record to dst. A body with
// nothing but the acquisition time (a plain acquisition without metadata,
// the common case) is written by hand, as encoding/json would write it,
// without its reflection; any other goes through encoding/json. A nil dst
// is allocated once, with room for a record without metadata.
func appendRecord(dst []byte, token, holderID string, body recordBody) ([]byte, error) {
	if dst == nil {
		dst = make([]byte, 0, len(token)+len(holderID)+len(`  ""{"acquired_at":""}`)+len(time.RFC3339Nano)+8)
	}
	dst = append(dst, token...)
	dst = append(dst, ' ')
	dst = strconv.AppendQuote(dst, holderID)
	dst = append(dst, '\n')
	if len(body.Metadata) == 0 && body.Mode == 0 && body.Limit == 0 && body.Key == "" {
		if y := body.AcquiredAt.Year(); y >= 0 && y <= 9999 {
			dst = append(dst, `{"acquired_at":"`...)
			dst = body.AcquiredAt.AppendFormat(dst, time.RFC3339Nano)
			return append(dst, `"}`...), nil
		}
	}
	js, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return append(dst, js...), nil
}

// decodeRecord parses the value of a lease record.
func decodeRecord(value []byte) (token, holderID string, body recordBody, err error) {
	header, js, ok := strings.Cut(string(value), "\n")
	if !ok {
		return "", "", body, errors.New("no header line")
	}
	token, quoted, ok := strings.Cut(header, " ")
	if !ok {
		return "", "", body, errors.New("malformed header line")
	}
	if holderID, err = strconv.Unquote(quoted); err != nil {
		return "", "", body, fmt.Errorf("malformed holder ID: %w", err)
	}
	if err := json.Unmarshal([]byte(js), &body); err != nil {
		return "", "", body, err
	}
	return token, holderID, body, nil
}

// newToken returns a lease token: the etcd lease ID, the acquisition time
// (Unix nanoseconds, so that SetMetadata can rewrite the record without
// reading it first) and a random part, each in hex.
func newToken(id clientv3.LeaseID, acquiredAt time.Time) string {
	return string(appendToken(make([]byte, 0, tokenLen), id, acquiredAt, 0))
}

// appendToken appends a token to dst: the etcd lease ID and the
// acquisition time in 16 hex digits each, then mark (if not 0) and 128
// random bits in hex, as backend.NewToken makes them, "-" between the parts.
func appendToken(dst []byte, id clientv3.LeaseID, acquiredAt time.Time, mark byte) []byte {
	dst = appendHex16(dst, uint64(id))
	dst = append(dst, '-')
	dst = appendHex16(dst, uint64(acquiredAt.UnixNano()))
	dst = append(dst, '-')
	if mark != 0 {
		dst = append(dst, mark)
	}
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		panic("etcdbackend: crypto/rand failed: " + err.Error())
	}
	return hex.AppendEncode(dst, r[:])
}

// tokenLen is the length of a token made by appendToken with a mark: two
// parts of 16 hex digits, the mark, 32 hex digits, and two "-".
const tokenLen = 16 + 1 + 16 + 1 + 1 + 32

// appendHex16 appends v to dst in 16 lower-case hex digits.
func appendHex16(dst []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, digits[(v>>shift)&0xf])
	}
	return dst
}

// parseToken returns the etcd lease ID encoded in a token made by newToken.
func parseToken(token string) (clientv3.LeaseID, bool) {
	if len(token) < 18 || token[16] != '-' {
		return 0, false
	}
	id, err := strconv.ParseUint(token[:16], 16, 64)
	if err != nil || id == 0 {
		return 0, false
	}
	return clientv3.LeaseID(id), true
}

// parseTokenTime returns the acquisition time encoded in a token made by
// newToken.
func parseTokenTime(token string) (time.Time, bool) {
	if len(token) < 35 || token[16] != '-' || token[33] != '-' {
		return time.Time{}, false
	}
	ns, err := strconv.ParseUint(token[17:33], 16, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, int64(ns)), true
}

// ownerCheck returns the comparisons that hold only while the store holds
// exactly lease l, whose etcd lease is id: the key was created at l.Term, is
// attached to id, and its value starts with l's header (token and holder).
func (b *Backend) ownerCheck(l backend.Lease, id clientv3.LeaseID) []clientv3.Cmp {
	return ownerCmps(b.leaseKey(l.Key), l, id)
}

// ownerCmps returns the comparisons that hold only while etcd key k holds
// exactly lease l (or entry l), whose etcd lease is id.
func ownerCmps(k string, l backend.Lease, id clientv3.LeaseID) []clientv3.Cmp {
	h := recordHeader(l.Token, l.HolderID)
	// A value starts with h (which ends in '\n') exactly when it sorts
	// strictly after h (the record body follows) and before h with its
	// last byte incremented.
	upper := h[:len(h)-1] + "\x0b"
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(k), "=", int64(l.Term)),
		clientv3.Compare(clientv3.LeaseValue(k), "=", id),
		clientv3.Compare(clientv3.Value(k), ">", h),
		clientv3.Compare(clientv3.Value(k), "<", upper),
	}
}

// Acquire creates a lease on req.Key if the key is free. The lease's TTL is
// req.TTL rounded up to whole seconds, or more if etcd's minimum is higher
// (see the package doc); the returned Lease.TTL is what etcd granted. The term is the key's create
// revision. When the key is held, Acquire returns a *backend.HeldError with
// the holder's record.
func (b *Backend) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if err := req.Validate(); err != nil {
		return backend.Lease{}, fmt.Errorf("etcdbackend: acquire: %w", err)
	}
	if err := checkKey(req.Key); err != nil {
		return backend.Lease{}, fmt.Errorf("etcdbackend: acquire: %w", err)
	}
	secs, err := ttlSeconds(req.TTL)
	if err != nil {
		return backend.Lease{}, fmt.Errorf("etcdbackend: acquire: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "acquire")
	if err != nil {
		return backend.Lease{}, err
	}
	defer cancel()

	if b.seenHeld(req.Key) {
		// The last attempt here found the key held and no watch here has
		// seen it deleted since: most likely it is still held, and a
		// read-only probe answers that without a grant and a revocation
		// (two raft writes).
		k := b.acquireKeys(req.Key)
		resp, err := b.txn(ctx, &pb.TxnRequest{Compare: k.freeCheck(), Failure: k.holderReads()})
		if err != nil {
			return backend.Lease{}, fail(ctx, fmt.Sprintf("acquire %q: probe", req.Key), err)
		}
		if !resp.Succeeded {
			return backend.Lease{}, b.heldError(ctx, req.Key, resp, 0)
		}
	}

	if !req.Detached {
		return b.acquireOnSession(ctx, req, secs)
	}
	grant, err := b.cli.Grant(ctx, secs)
	if err != nil {
		return backend.Lease{}, fail(ctx, fmt.Sprintf("acquire %q: grant lease", req.Key), err)
	}
	lease, revoked, err := b.acquireWith(ctx, req, grant)
	if err != nil && !revoked && ctx.Err() == nil {
		// The grant holds nothing, or (if the transaction's outcome is
		// unknown) maybe the key: revoking it frees the key at once. When
		// ctx has ended, the grant expires on its own.
		_, _ = b.cli.Revoke(ctx, grant.ID)
	}
	if err == nil {
		b.setSeenHeld(req.Key, false)
	}
	return lease, err
}

// acquireKeys are the etcd keys that the transaction of an acquisition of
// one key compares, writes and reads (freeCheck, holderReads), made in one
// buffer: one allocation where a string and a copy of each took two
// (etcd's client does not modify them).
type acquireKeys struct {
	rec       []byte // <prefix><key>: the lease record
	holders   []byte // <prefix><key>\x00h: the first holder entry of backend.Modes
	waiters   []byte // <prefix><key>\x00j: past the intents, before the waiters
	hb, hbEnd []byte // <prefix><key>/heartbeat/ and the end of its range
}

// acquireKeys returns the keys of an acquisition of key.
func (b *Backend) acquireKeys(key string) acquireKeys {
	n := len(b.prefix) + len(key)
	buf := make([]byte, 0, 5*n+4+2*len(heartbeatInfix))
	buf = append(append(buf, b.prefix...), key...)
	var k acquireKeys
	k.rec = buf[:n:n]
	part := func(suffix string) []byte {
		start := len(buf)
		buf = append(append(buf, k.rec...), suffix...)
		return buf[start:len(buf):len(buf)]
	}
	k.holders = part("\x00" + holdersPart)
	k.waiters = part("\x00j")
	k.hb = part(heartbeatInfix)
	// The end of the range of keys beginning with hb, as
	// clientv3.GetPrefixRangeEnd makes it: hb ends with "/", which is
	// incremented.
	k.hbEnd = part(heartbeatInfix)
	k.hbEnd[len(k.hbEnd)-1]++
	return k
}

// freeCheck returns the comparisons that hold while key is free for
// Acquire: no lease record, and no holder or intent entry of backend.Modes
// (waiters do not count).
func (k acquireKeys) freeCheck() []*pb.Compare {
	return []*pb.Compare{
		{Result: pb.Compare_EQUAL, Target: pb.Compare_CREATE, Key: k.rec, TargetUnion: &pb.Compare_CreateRevision{}},
		// Holders ("h...") and intents ("i...").
		{Result: pb.Compare_EQUAL, Target: pb.Compare_CREATE, Key: k.holders, RangeEnd: k.waiters, TargetUnion: &pb.Compare_CreateRevision{}},
	}
}

// holderReads returns the reads that the else-branch of an acquisition
// makes: one range holding the key's record, its release marker and its
// holder and intent entries (<prefix><key> up to the waiters, which sort
// after "j"; see splitHolderReads), and the key's heartbeats.
func (k acquireKeys) holderReads() []*pb.RequestOp {
	return []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: k.rec, RangeEnd: k.waiters}}},
		{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: k.hb, RangeEnd: k.hbEnd}}},
	}
}

// freeCheck returns acquireKeys.freeCheck of key.
func (b *Backend) freeCheck(key string) []*pb.Compare { return b.acquireKeys(key).freeCheck() }

// holderReads returns acquireKeys.holderReads of key.
func (b *Backend) holderReads(key string) []*pb.RequestOp { return b.acquireKeys(key).holderReads() }

// splitHolderReads splits the reads of holderReads into the record of key
// (at most one), its holder and intent entries, and its heartbeats.
func (b *Backend) splitHolderReads(key string, resp *clientv3.TxnResponse) (recKVs, entries, hbKVs []*mvccpb.KeyValue) {
	k, base := b.leaseKey(key), b.entryBase(key)
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		switch s := string(kv.Key); {
		case s == k:
			recKVs = append(recKVs, kv)
		case len(s) > len(base) && s[:len(base)] == base:
			entries = append(entries, kv) // not the marker, which is base itself
		}
	}
	return recKVs, entries, resp.Responses[1].GetResponseRange().Kvs
}

// The transactions of Acquire, and of Renew and Release on a session (a
// lock taken and released in a loop: its every request), are built as
// protocol messages and sent by txn: clientv3's Txn builder clones each
// comparison by reflection, which cost about as much client CPU as the
// rest of the call. The helpers below build what clientv3.Compare,
// clientv3.OpGet, clientv3.OpPut and clientv3.OpDelete would.

// txn sends the transaction r through the client's KV service, as
// clientv3's Txn.Commit does: waiting for a connection, through the
// client's interceptors (authentication, retries of requests that were
// never sent), with its errors translated the same way.
//
// The request is sent without a deadline (see noDeadline): ctx still ends
// it, by cancelling its stream.
func (b *Backend) txn(ctx context.Context, r *pb.TxnRequest) (*clientv3.TxnResponse, error) {
	resp, err := b.kv.Txn(noDeadline{ctx}, r, grpc.WaitForReady(true))
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.TxnResponse)(resp), nil
}

// noDeadline is a context that ends when its parent does, with the same
// error, but reports no deadline. gRPC sends the deadline of a request's
// context to the server (the grpc-timeout header), which then arms a timer
// and a context of its own for the request: with a lock taken and released
// in a loop by 16 goroutines, 15 of the 790 allocations of each pair,
// server and client together (BenchmarkPairs). The deadline adds nothing that
// the cancellation does not: when ctx ends, gRPC cancels the request's
// stream at once, the call returns ctx's error (ContextError), and the
// server cancels the request's context when the stream is reset, as it
// would at its own deadline. Its Value delegates to the parent, so
// contexts derived from it (gRPC's own, per stream) are cancelled with the
// parent without a goroutine of their own.
type noDeadline struct{ context.Context }

// Deadline reports no deadline.
func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// putOp puts value under key, attached to etcd lease id.
func putOp(key, value string, id clientv3.LeaseID) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: []byte(key), Value: []byte(value), Lease: int64(id),
	}}}
}

// deleteOp deletes key.
func deleteOp(key string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(key)}}}
}

// tokenCheck returns the comparisons that hold only while the record of l's
// key starts with l's header (token and holder ID), as protocol messages.
// This is the owner check of a lease on a session for Release and Renew:
// the token's 128 random bits make a record with it the one that l's
// acquisition wrote (or SetMetadata rewrote, owner-checked, with the same
// creation revision and etcd lease), so the creation revision and etcd
// lease that ownerCheck compares as well add nothing, and each comparison
// costs the server a read of the key.
func (b *Backend) tokenCheck(l backend.Lease) []*pb.Compare {
	cmps, _ := b.tokenCheckKey(l)
	return cmps
}

// tokenCheckKey returns tokenCheck's comparisons, and the etcd key of l's
// record that they compare (in their buffer: Release deletes it without a
// string and a copy of its own).
func (b *Backend) tokenCheckKey(l backend.Lease) ([]*pb.Compare, []byte) {
	// One buffer for the key, the header and its upper bound (see
	// ownerCmps), none of which etcd's client modifies.
	n := len(b.prefix) + len(l.Key)
	buf := make([]byte, 0, n+2*(len(l.Token)+len(l.HolderID)+8))
	buf = append(buf, b.prefix...)
	buf = append(buf, l.Key...)
	buf = append(buf, l.Token...)
	buf = append(buf, ' ')
	buf = strconv.AppendQuote(buf, l.HolderID)
	buf = append(buf, '\n')
	m := len(buf)
	buf = append(buf, buf[n:m-1]...)
	buf = append(buf, '\x0b')
	k, h, upper := buf[:n:n], buf[n:m:m], buf[m:]
	return []*pb.Compare{
		{Result: pb.Compare_GREATER, Target: pb.Compare_VALUE, Key: k, TargetUnion: &pb.Compare_Value{Value: h}},
		{Result: pb.Compare_LESS, Target: pb.Compare_VALUE, Key: k, TargetUnion: &pb.Compare_Value{Value: upper}},
	}, k
}

// seenHeld reports whether the last acquisition of key by this backend
// found it held, with no deletion seen by a watch since. It is a hint for
// saving requests, never for correctness.
func (b *Backend) seenHeld(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.held[key]
	return ok
}

// setSeenHeld records whether key was last seen held.
func (b *Backend) setSeenHeld(key string, held bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if held {
		b.held[key] = time.Now()
	} else {
		delete(b.held, key)
	}
}

// acquireWith runs the transactions of Acquire with an etcd lease already
// granted. On failure, revoked reports whether it has revoked the grant.
func (b *Backend) acquireWith(ctx context.Context, req backend.AcquireRequest, grant *clientv3.LeaseGrantResponse) (_ backend.Lease, revoked bool, _ error) {
	k := b.leaseKey(req.Key)
	now := time.Now()
	token := newToken(grant.ID, now)
	value, err := encodeRecord(token, req.HolderID, recordBody{AcquiredAt: now, Metadata: req.Metadata})
	if err != nil {
		return backend.Lease{}, false, fmt.Errorf("etcdbackend: acquire %q: encode record: %w", req.Key, err)
	}
	resp, err := b.txn(ctx, &pb.TxnRequest{
		Compare: b.freeCheck(req.Key),
		// The lease mark with the record (see leaseMark).
		Success: []*pb.RequestOp{putOp(k, value, grant.ID), putOp(b.leaseMark(grant.ID), "", grant.ID)},
		Failure: b.holderReads(req.Key),
	})
	if err != nil {
		return backend.Lease{}, false, fail(ctx, fmt.Sprintf("acquire %q", req.Key), err)
	}
	if !resp.Succeeded {
		return backend.Lease{}, true, b.heldError(ctx, req.Key, resp, grant.ID)
	}
	return backend.Lease{
		Key:      req.Key,
		HolderID: req.HolderID,
		Token:    token,
		// The transaction's only write created the key at this revision.
		Term: uint64(resp.Header.Revision),
		TTL:  time.Duration(grant.TTL) * time.Second,
	}, false, nil
}

// heldError turns the else-branch reads of a failed acquisition into a
// *backend.HeldError, looking up the holder's remaining TTL and heartbeat age
// while it revokes the unused grant (if any).
func (b *Backend) heldError(ctx context.Context, key string, resp *clientv3.TxnResponse, grant clientv3.LeaseID) error {
	op := fmt.Sprintf("acquire %q", key)
	recKVs, entries, hbKVs := b.splitHolderReads(key, resp)
	if len(recKVs) == 0 {
		// Held by entries of backend.Modes: holders and intents.
		owners := make([]string, len(entries))
		for i := range owners {
			owners[i] = key
		}
		var revoke []clientv3.LeaseID
		if grant != 0 {
			revoke = append(revoke, grant)
		}
		recs, err := b.entryRecords(ctx, owners, entries, revoke)
		if err != nil {
			return fail(ctx, op, err)
		}
		if len(recs) == 0 {
			return fail(ctx, op, errors.New("held, but nothing read"))
		}
		b.setSeenHeld(key, true)
		return &backend.HeldError{Holder: recs[0], Holders: recs}
	}
	var revokeErr error
	var wg sync.WaitGroup
	if grant != 0 {
		wg.Go(func() { _, revokeErr = b.cli.Revoke(ctx, grant) })
	}
	rec, err := b.record(ctx, key, recKVs, hbKVs)
	wg.Wait()
	_ = revokeErr // an unrevoked grant holds nothing and expires on its own
	switch {
	case errors.Is(err, errLeaseGone):
		// The holder released or expired just after the transaction saw
		// it. The record is as of the transaction, with no TTL left, so
		// the caller retries at once.
	case err != nil:
		// Including backend.ErrNotHeld, which cannot happen: the
		// else-branch runs only when the key exists, and reads it in the
		// same transaction.
		return fail(ctx, op, err)
	}
	b.setSeenHeld(key, true)
	return &backend.HeldError{Holder: rec}
}

// Renew keeps the lease's etcd lease alive, after checking in a read-only
// transaction that the store still holds exactly that lease. It returns an
// error wrapping backend.ErrLeaseLost otherwise.
func (b *Backend) Renew(ctx context.Context, l backend.Lease) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("etcdbackend: renew: %w", err)
	}
	if err := checkKey(l.Key); err != nil {
		return fmt.Errorf("etcdbackend: renew: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "renew")
	if err != nil {
		return err
	}
	defer cancel()
	id, ok := parseToken(l.Token)
	if !ok {
		return fmt.Errorf("etcdbackend: renew %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	if l.Entry != nil {
		return b.renewEntry(ctx, l, id)
	}
	if onSession(l.Token) {
		return b.renewOnSession(ctx, l, id)
	}
	resp, err := b.cli.Txn(ctx).If(b.ownerCheck(l, id)...).Commit()
	if err != nil {
		return fail(ctx, fmt.Sprintf("renew %q", l.Key), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: renew %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
	}
	if _, err := b.keepAliveOnce(ctx, id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("etcdbackend: renew %q term %d: lease expired: %w", l.Key, l.Term, backend.ErrLeaseLost)
		}
		return fail(ctx, fmt.Sprintf("renew %q: keep-alive", l.Key), err)
	}
	return nil
}

// Release deletes the lease's record if the store still holds exactly that
// lease, then revokes its etcd lease. It returns an error wrapping
// backend.ErrLeaseLost, and changes nothing, otherwise.
func (b *Backend) Release(ctx context.Context, l backend.Lease) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("etcdbackend: release: %w", err)
	}
	if err := checkKey(l.Key); err != nil {
		return fmt.Errorf("etcdbackend: release: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "release")
	if err != nil {
		return err
	}
	defer cancel()
	id, ok := parseToken(l.Token)
	if !ok {
		return fmt.Errorf("etcdbackend: release %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	if l.Entry != nil {
		return b.releaseEntry(ctx, l, id)
	}
	if onSession(l.Token) {
		return b.releaseOnSession(ctx, l, id)
	}
	// The deletion alone: its revision deletes no lease mark, so watchers
	// report it as a release (see deletionType), as for a lease on a
	// session; the revocation below deletes the lease mark later, with no
	// record.
	resp, err := b.cli.Txn(ctx).
		If(b.ownerCheck(l, id)...).
		Then(clientv3.OpDelete(b.leaseKey(l.Key))).
		Commit()
	if err != nil {
		return fail(ctx, fmt.Sprintf("release %q", l.Key), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: release %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
	}
	// The key is free; the lease now holds only its lease mark. If
	// revoking fails, the mark expires with the lease's TTL.
	if ctx.Err() == nil {
		_, _ = b.cli.Revoke(ctx, id)
	}
	return nil
}

// Get returns the current record of key, with its remaining TTL and the
// holder's heartbeat, or an error wrapping backend.ErrNotHeld.
func (b *Backend) Get(ctx context.Context, key string) (backend.Record, error) {
	if err := checkKey(key); err != nil {
		return backend.Record{}, fmt.Errorf("etcdbackend: get: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "get")
	if err != nil {
		return backend.Record{}, err
	}
	defer cancel()
	base := b.entryBase(key)
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.leaseKey(key)),
		clientv3.OpGet(b.heartbeatPrefix(key), clientv3.WithPrefix()),
		clientv3.OpGet(base+holdersPart, clientv3.WithRange(base+intentsPart)),
	).Commit()
	if err != nil {
		return backend.Record{}, fail(ctx, fmt.Sprintf("get %q", key), err)
	}
	recKVs := resp.Responses[0].GetResponseRange().Kvs
	hbKVs := resp.Responses[1].GetResponseRange().Kvs
	if len(recKVs) == 0 {
		// The oldest holder entry of backend.Modes, if any: the first
		// one whose lease is still there.
		entries := slices.Clone(resp.Responses[2].GetResponseRange().Kvs)
		slices.SortFunc(entries, func(x, y *mvccpb.KeyValue) int { return cmp.Compare(x.CreateRevision, y.CreateRevision) })
		for _, kv := range entries {
			rec, err := b.record(ctx, key, []*mvccpb.KeyValue{kv}, hbKVs)
			if errors.Is(err, errLeaseGone) {
				continue
			}
			if err != nil {
				return backend.Record{}, fail(ctx, fmt.Sprintf("get %q", key), err)
			}
			return rec, nil
		}
	}
	rec, err := b.record(ctx, key, recKVs, hbKVs)
	if errors.Is(err, backend.ErrNotHeld) || errors.Is(err, errLeaseGone) {
		return backend.Record{}, fmt.Errorf("etcdbackend: get %q: %w", key, backend.ErrNotHeld)
	}
	if err != nil {
		return backend.Record{}, fail(ctx, fmt.Sprintf("get %q", key), err)
	}
	return rec, nil
}

// record builds the record of key from a read of its lease record (recKVs)
// and of its heartbeat records (hbKVs), looking up the remaining TTLs of the
// lease and of the holder's heartbeat in parallel. It returns
// backend.ErrNotHeld if there is no record, and the record as read (no TTL
// left) with errLeaseGone if its lease has gone since.
func (b *Backend) record(ctx context.Context, key string, recKVs, hbKVs []*mvccpb.KeyValue) (backend.Record, error) {
	if len(recKVs) == 0 {
		return backend.Record{}, backend.ErrNotHeld
	}
	rec, lease, err := parseEntry(key, recKVs[0])
	if err != nil {
		return backend.Record{}, err
	}
	ids := []clientv3.LeaseID{lease}
	hbKey := b.heartbeatKey(key, rec.HolderID)
	for _, h := range hbKVs {
		if string(h.Key) == hbKey && h.Lease != 0 {
			ids = append(ids, clientv3.LeaseID(h.Lease))
			break
		}
	}
	ttls := b.lookup(ctx, ids)
	var hb *leaseTTL
	if len(ttls) > 1 {
		hb = &ttls[1]
	}
	return completeRecord(rec, ttls[0], hb, time.Now())
}

// parseRecord decodes the lease record kv of key, without its TTL and
// heartbeat, and returns it with the etcd lease attached to it.
func parseRecord(key string, kv *mvccpb.KeyValue) (backend.Record, clientv3.LeaseID, error) {
	token, holder, body, err := decodeRecord(kv.Value)
	if err != nil {
		return backend.Record{}, 0, fmt.Errorf("malformed record at %q: %w", kv.Key, err)
	}
	return backend.Record{
		Key:        key,
		HolderID:   holder,
		Token:      token,
		Term:       uint64(kv.CreateRevision),
		AcquiredAt: body.AcquiredAt,
		Metadata:   body.Metadata,
	}, clientv3.LeaseID(kv.Lease), nil
}

// completeRecord fills in rec's TTL, renewal time and heartbeat from the
// look-ups of its lease (lt) and of its holder's heartbeat lease (hb, nil if
// the holder has no heartbeat record), made at about now. It returns rec as
// read, with no TTL left, and errLeaseGone if the lease has gone.
func completeRecord(rec backend.Record, lt leaseTTL, hb *leaseTTL, now time.Time) (backend.Record, error) {
	if hb != nil {
		if hb.err != nil {
			return backend.Record{}, fmt.Errorf("look up heartbeat of %q: %w", rec.HolderID, hb.err)
		}
		if hb.remaining >= 0 {
			rec.HeartbeatAge = hb.age()
			rec.HeartbeatAt = now.Add(-rec.HeartbeatAge)
		}
	}
	if lt.err != nil {
		return backend.Record{}, fmt.Errorf("look up lease of %q: %w", rec.Key, lt.err)
	}
	if lt.remaining < 0 {
		rec.RenewedAt = rec.AcquiredAt
		return rec, errLeaseGone
	}
	rec.TTL = time.Duration(lt.remaining) * time.Second
	rec.RenewedAt = now.Add(-lt.age())
	if rec.RenewedAt.Before(rec.AcquiredAt) {
		rec.RenewedAt = rec.AcquiredAt
	}
	return rec, nil
}

// SetMetadata replaces the metadata of the lease's record if the store still
// holds exactly that lease, in one owner-checked transaction that rewrites
// the record with the same etcd lease attached (the create revision, hence
// the term, and the lease's TTL are unchanged). It returns an error wrapping
// backend.ErrLeaseLost, and changes nothing, otherwise. Watchers of the key
// see the rewrite as backend.EventChanged.
func (b *Backend) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("etcdbackend: set metadata: %w", err)
	}
	if err := checkKey(l.Key); err != nil {
		return fmt.Errorf("etcdbackend: set metadata: %w", err)
	}
	ctx, cancel, err := b.begin(ctx, "set metadata")
	if err != nil {
		return err
	}
	defer cancel()
	id, ok := parseToken(l.Token)
	at, okAt := parseTokenTime(l.Token)
	if !ok || !okAt {
		return fmt.Errorf("etcdbackend: set metadata of %q: foreign token: %w", l.Key, backend.ErrLeaseLost)
	}
	if l.Entry != nil {
		return b.setEntryMetadata(ctx, l, id, at, md)
	}
	value, err := encodeRecord(l.Token, l.HolderID, recordBody{AcquiredAt: at, Metadata: md})
	if err != nil {
		return fmt.Errorf("etcdbackend: set metadata of %q: encode record: %w", l.Key, err)
	}
	resp, err := b.cli.Txn(ctx).
		If(b.ownerCheck(l, id)...).
		Then(clientv3.OpPut(b.leaseKey(l.Key), value, clientv3.WithLease(id))).
		Commit()
	if err != nil {
		return fail(ctx, fmt.Sprintf("set metadata of %q", l.Key), err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdbackend: set metadata of %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
	}
	return nil
}

// List returns the records of every held key that begins with prefix,
// sorted by key. It reads everything under the backend's prefix followed by
// prefix in one range read, keeps the lease records (skipping heartbeat
// records, release markers and anything under the prefix that is not a
// record of this package), then looks up the remaining TTL of each record's
// etcd lease, up to 16 look-ups at a time (etcd has no batched TimeToLive).
// A List that finds n held keys thus costs 1 + n requests, none of them a
// raft write. The records carry no heartbeat fields, which would cost
// another look-up per holder: Get has them. A key whose lease ends between
// the read and its look-up is left out.
func (b *Backend) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	ctx, cancel, err := b.begin(ctx, "list")
	if err != nil {
		return nil, err
	}
	defer cancel()
	op := fmt.Sprintf("list %q", prefix)
	resp, err := b.cli.Get(ctx, b.prefix+prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fail(ctx, op, err)
	}
	var recs []backend.Record
	var ids []clientv3.LeaseID // the lease of each record
	for _, kv := range resp.Kvs {
		key := string(kv.Key)[len(b.prefix):]
		if k, rest, ok := strings.Cut(key, "\x00"); ok {
			// An entry of backend.Modes: only holders are listed, under
			// their key.
			if !strings.HasPrefix(rest, exclusiveHolders) && !strings.HasPrefix(rest, sharedHolders) {
				continue
			}
			key = k
		}
		if checkKey(key) != nil || kv.Lease == 0 {
			continue // a heartbeat record, a release marker, or not ours
		}
		rec, lease, err := parseEntry(key, kv)
		if err != nil {
			continue // not a lease record of this package
		}
		recs = append(recs, rec)
		ids = append(ids, lease)
	}
	out, err := b.completeLive(ctx, op, recs, ids)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b backend.Record) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return cmp.Compare(a.Term, b.Term)
	})
	return out, nil
}

// completeLive looks up the etcd lease of each record (ids[i] is the lease
// of recs[i]) and returns the records completed with what the look-ups
// found, in the order of recs, leaving out those whose lease has gone since
// they were read. Any other failure fails the call, reported as op.
func (b *Backend) completeLive(ctx context.Context, op string, recs []backend.Record, ids []clientv3.LeaseID) ([]backend.Record, error) {
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
	return out, nil
}

// errLeaseGone reports that a record's lease ended between reading the
// record and looking up its lease.
var errLeaseGone = errors.New("etcdbackend: lease gone since the read")

// leaseTTL is the state of one etcd lease as etcd reports it, in whole
// seconds.
type leaseTTL struct {
	remaining int64 // -1: the lease does not exist (any more)
	granted   int64
	err       error
}

// age is how long ago the lease was granted or last kept alive, by the
// store's clock: granted minus remaining TTL. etcd rounds the remaining TTL
// down to whole seconds, so this returns the lower bound, one second less.
func (t leaseTTL) age() time.Duration {
	s := t.granted - t.remaining - 1
	if s < 0 {
		s = 0
	}
	return time.Duration(s) * time.Second
}

// maxParallelLookups bounds the concurrent lease look-ups of one call.
const maxParallelLookups = 16

// lookup asks etcd for the remaining TTL of each lease, in parallel.
func (b *Backend) lookup(ctx context.Context, ids []clientv3.LeaseID) []leaseTTL {
	out := make([]leaseTTL, len(ids))
	one := func(i int) {
		resp, err := b.cli.TimeToLive(ctx, ids[i])
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			out[i] = leaseTTL{remaining: -1}
		case err != nil:
			out[i] = leaseTTL{err: err}
		default:
			out[i] = leaseTTL{remaining: resp.TTL, granted: resp.GrantedTTL}
		}
	}
	if len(ids) == 1 {
		one(0)
		return out
	}
	sem := make(chan struct{}, maxParallelLookups)
	var wg sync.WaitGroup
	for i := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			one(i)
		})
	}
	wg.Wait()
	return out
}
