package redisbackend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
)

// Shared locks, semaphores, hierarchies and fair queueing (backend.Modes).
//
// Each operation is one Lua script (see modes_scripts.go), by the server's
// clock (TIME), in one round trip:
//
//   - An entry (a Shared or Exclusive holder from AcquireMode) is a field of
//     its key's lease hash, which then carries the marker field modes=1
//     instead of the fields of a plain lease; an intent is a field of each
//     ancestor's lease hash. The hash expires with its latest entry, so a
//     plain Acquire, which only looks at whether the hash exists on its
//     way to success, costs what it did; it reads the entries only when it
//     fails. Each entry carries its own expiry (unix ms by the server's
//     clock) and is dead past it, wherever it is read.
//   - Waiters are tickets in a second hash, <name>:waiters, numbered in
//     arrival order by its counter seq, each with its own expiry and mode;
//     every script that reads them prunes the dead ones (when it writes),
//     and the hash goes with its last live waiter (counter included).
//   - A hierarchy's keys are all in one hash slot, so one script reaches
//     them on Cluster: see Hierarchies and Cluster in the package doc.
//     AcquireMode of a hierarchical lock that is not Fair reads its
//     ancestors' waiter tickets in the same script: an Exclusive waiter
//     above refuses it (ModeSupport.AncestorWaiters).
//
// Cost: a script reads every entry of its key (and of each ancestor, for
// AcquireMode): O(entries) per operation, where a plain lease is O(1). A
// root with many live locks below it carries one intent per lock, which
// every hierarchical acquisition and release in its tree reads (only each
// intent's expiry, unless it conflicts). Every operation is one round
// trip; on the server (TestModesRoundTrips counts them) AcquireMode of a
// free key runs 8 commands (16 with two ancestors, whose lease hashes and
// waiter tickets it reads), Renew of an entry 6 (16 with two ancestors: one
// PUBLISH of the renewal per channel), Release 6 (14), a failed AcquireMode 4 to 10, Holders and Get 3 or 4. BenchmarkModes measured about 30 µs of server
// time per plain Acquire+Release pair of a lock key, 50 to 65 for an
// Exclusive or Shared entry, 120 for a page with two ancestors under a
// root holding 10 other pages.

var _ backend.Modes = (*Backend)(nil)

// ModeSupport implements backend.Modes: Shared (with and without a limit),
// hierarchies, fair queueing, writer preference and the Exclusive waiters of
// an ancestor blocking new hierarchical locks below it are all supported.
func (b *Backend) ModeSupport() backend.ModeSupport {
	return backend.ModeSupport{Shared: true, Hierarchical: true, Fair: true, WriterFirst: true, AncestorWaiters: true}
}

// AcquireMode implements backend.Modes, in one script (one round trip; with
// Options.WaitReplicas, EVALSHA and WAIT in one pipeline). The entry's TTL,
// its intents' and a waiter registration's are req.TTL rounded up to whole
// milliseconds. Every ancestor must share the key's hash slot on Cluster
// (lock keys of one tree do; see the package doc), or the request fails
// with an error wrapping backend.ErrInvalid. With req.RegisterOnly the
// script registers the waiter whether or not the key is held, writes no
// entry, and answers FREE (backend.ErrRegisteredOnly) when it could have.
func (b *Backend) AcquireMode(ctx context.Context, req backend.ModeRequest) (backend.Lease, error) {
	if err := b.begin(ctx); err != nil {
		return backend.Lease{}, err
	}
	if err := req.Validate(); err != nil {
		return backend.Lease{}, err
	}
	if err := b.ModeSupport().Check(req); err != nil {
		return backend.Lease{}, err
	}
	if err := b.ValidateKey(req.Key); err != nil {
		return backend.Lease{}, err
	}
	base := b.keyBase(req.Key)
	for _, a := range req.Ancestors {
		if err := b.ValidateKey(a); err != nil {
			return backend.Lease{}, err
		}
		if b.sharded() && hashTag(b.keyBase(a)) != hashTag(base) {
			return backend.Lease{}, fmt.Errorf("redisbackend: %w: ancestor %q of %q is in another hash slot (only lock keys of one tree, %q and below, share one)",
				backend.ErrInvalid, a, req.Key, backend.LockKeyPrefix+"<root>")
		}
	}
	l, err := b.acquireMode(ctx, req, base)
	var held *backend.HeldError
	if errors.As(err, &held) && b.reclaimNamed(ctx, req.HolderID, held) {
		// Held by an entry of this Backend's own acquisition whose reply
		// was lost, now deleted (see lostreply.go): once more.
		l, err = b.acquireMode(ctx, req, base)
	}
	return l, err
}

// acquireMode is one attempt of AcquireMode, on a validated request; base
// is keyBase(req.Key).
func (b *Backend) acquireMode(ctx context.Context, req backend.ModeRequest, base string) (backend.Lease, error) {
	token := backend.NewToken()
	ttl := ttlMillis(req.TTL)
	mode, fair := "x", "0"
	if req.Mode == backend.Shared {
		mode = "s"
	}
	if req.Fair {
		fair = "1"
	}
	keys := make([]string, 0, 3+2*len(req.Ancestors))
	keys = append(keys, base, base+":term", base+":waiters")
	// The lost acquisitions this one cleans up (lostreply.go): nil but
	// after a lost reply.
	toks, wids := b.lostAcq.forMode(req.Key, req.HolderID, req.WaitID, req.Ancestors, time.Now())
	args := make([]any, 0, 15+len(req.Ancestors)+len(toks)+len(wids)+2*len(req.Metadata))
	args = append(args, req.HolderID, token, ttl, ttlMillis(b.termKeep), mode, strconv.Itoa(req.Limit), fair,
		req.WaitID, b.publishCmd, b.channel(req.Key), req.Key, len(req.Ancestors))
	for _, a := range req.Ancestors {
		keys = append(keys, b.keyBase(a))
		args = append(args, a)
	}
	for _, a := range req.Ancestors {
		keys = append(keys, b.keyBase(a)+":waiters")
	}
	args = append(args, len(toks)/2, len(wids))
	args = append(args, toks...)
	args = append(args, wids...)
	for k, v := range req.Metadata {
		args = append(args, k, v)
	}
	ronly := ""
	if req.RegisterOnly {
		ronly = "1"
	}
	args = append(args, ronly, b.guard(req.AcquireRequest))
	reply, waitErr, err := b.run(ctx, acquireModeScript, b.waitN > 0, keys, args...)
	if err != nil {
		// No reply: the script may still run (see lostreply.go). With
		// RegisterOnly it writes no entry under token: the next call's
		// look for it finds nothing, but its wait ID is remembered.
		b.lostAcq.rememberEntry(req.Key, req.HolderID, token, req.WaitID, req.Ancestors, time.Now())
		return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
	}
	if len(reply) >= 2 && str(reply[0]) == "RECLAIMED" {
		// Lost acquisitions' entries (or leases) found and deleted.
		n := int(max(0, min(num(reply[1]), int64(len(reply)-2))))
		for _, tok := range reply[2 : 2+n] {
			b.lostAcq.forget(req.Key, str(tok))
		}
		if reply = reply[2+n:]; len(reply) == 0 {
			return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: short reply", req.Key)
		}
	}
	status, err := checkStatus("acquire", req.Key, reply)
	if err != nil {
		return backend.Lease{}, err
	}
	if err, ok := restartRefusal(req.Key, status, reply); ok {
		return backend.Lease{}, err
	}
	if req.WaitID != "" && (status == "OK" || status == "HELD" || status == "FREE") {
		// The wait goes on (HELD, FREE) or has ended (see lostreply.go).
		b.lostAcq.waitSeen(req.Key, req.WaitID, status != "OK")
	}
	switch status {
	case "FREE":
		return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, backend.ErrRegisteredOnly)
	case "OK":
		if len(reply) < 2 {
			break
		}
		n, err := parseTerm(reply[1])
		if err != nil {
			return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
		}
		l := backend.Lease{Key: req.Key, HolderID: req.HolderID, Token: token, Term: n, TTL: millis(ttl),
			Entry: &backend.Entry{Mode: req.Mode, Limit: req.Limit, Ancestors: slices.Clone(req.Ancestors)}}
		if waitErr != nil {
			return backend.Lease{}, b.dropUnreplicated(ctx, l, waitErr)
		}
		return l, nil
	case "HELD":
		herr, err := parseHeld(req.Key, reply)
		if err != nil {
			return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: %w", req.Key, err)
		}
		return backend.Lease{}, herr
	case "MISMATCH":
		if len(reply) < 2 {
			break
		}
		return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q with limit %d: %w: the live shared holders have limit %s",
			req.Key, req.Limit, backend.ErrLimitMismatch, str(reply[1]))
	}
	return backend.Lease{}, fmt.Errorf("redisbackend: acquire %q: unexpected reply %#v", req.Key, reply)
}

// sharded reports whether the client spreads keys over several servers by
// hash slot (Cluster) or hash tag (Ring), so that one script reaches only
// the keys of one slot.
func (b *Backend) sharded() bool {
	if b.cluster != nil {
		return true
	}
	_, ring := b.client.(*redis.Ring)
	return ring
}

// Holders implements backend.Modes: one script reads the key's live
// holders (a plain lease counts as one Exclusive holder; intents and
// waiters are not holders).
func (b *Backend) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	if err := b.beginKey(ctx, key); err != nil {
		return nil, err
	}
	recs, err := b.holders(ctx, "holders of", key, true)
	if err != nil {
		return nil, err
	}
	if recs == nil {
		recs = []backend.Record{}
	}
	return recs, nil
}

// holders runs the holders script on key: every live holder, or only the
// oldest. op names the operation in errors.
func (b *Backend) holders(ctx context.Context, op, key string, all bool) ([]backend.Record, error) {
	flag := "0"
	if all {
		flag = "1"
	}
	reply, _, err := b.run(ctx, holdersScript, false, []string{b.keyBase(key)}, flag)
	if err != nil {
		return nil, fmt.Errorf("redisbackend: %s %q: %w", op, key, err)
	}
	status, err := checkStatus(op, key, reply)
	if err != nil {
		return nil, err
	}
	if status != "OK" {
		return nil, fmt.Errorf("redisbackend: %s %q: unexpected reply %#v", op, key, reply)
	}
	recs, err := parseRecords(key, reply[1:])
	if err != nil {
		return nil, fmt.Errorf("redisbackend: %s %q: %w", op, key, err)
	}
	return recs, nil
}

// CancelWait implements backend.Modes: one script removes the
// registration and, when it was live, publishes a change on the key's
// channel, so that the waiters behind it look again. A registration that
// expires is not published (Redis tells nobody when a field's time is up;
// the backend uses no keyspace notifications): the waiters behind it see
// it gone at their next retry, which each makes before its own
// registration's TTL runs out.
func (b *Backend) CancelWait(ctx context.Context, key, waitID string) error {
	if err := b.beginKey(ctx, key); err != nil {
		return err
	}
	if waitID == "" {
		return fmt.Errorf("redisbackend: %w: empty wait ID", backend.ErrInvalid)
	}
	// The wait has ended: a registration that a lost attempt of it writes
	// later is nobody's (see lostreply.go).
	b.lostAcq.waitSeen(key, waitID, false)
	reply, _, err := b.run(ctx, cancelWaitScript, false, []string{b.keyBase(key) + ":waiters"},
		waitID, b.publishCmd, b.channel(key))
	if err != nil {
		return fmt.Errorf("redisbackend: cancel wait %q of %q: %w", waitID, key, err)
	}
	_, err = checkStatus("cancel wait", key, reply)
	return err
}

// entryKeys returns the lease hash names an entry's scripts work on: the
// key's, then each ancestor's.
func (b *Backend) entryKeys(l backend.Lease) []string {
	keys := make([]string, 0, 1+len(l.Entry.Ancestors))
	keys = append(keys, b.keyBase(l.Key))
	for _, a := range l.Entry.Ancestors {
		keys = append(keys, b.keyBase(a))
	}
	return keys
}

// validateEntry checks the ancestors of an entry lease (the lease itself
// has passed validateLease).
func (b *Backend) validateEntry(l backend.Lease) error {
	for _, a := range l.Entry.Ancestors {
		if err := b.ValidateKey(a); err != nil {
			return err
		}
	}
	return nil
}

// renewEntry is Renew of a lease from AcquireMode: the entry and its
// intents are extended to lease.TTL from now, if the entry is still the
// lease's and alive, and every intent is still there, and the renewal is
// published on the key's renewals channel and each ancestor's
// (EventRenewed, for WatchRenewals).
func (b *Backend) renewEntry(ctx context.Context, l backend.Lease) error {
	if err := b.validateEntry(l); err != nil {
		return err
	}
	args := make([]any, 0, 5+len(l.Entry.Ancestors))
	args = append(args, l.HolderID, l.Token, ttlMillis(l.TTL), b.publishCmd, b.renewalsChannel(l.Key))
	for _, a := range l.Entry.Ancestors {
		args = append(args, b.renewalsChannel(a))
	}
	reply, waitErr, err := b.run(ctx, renewEntryScript, b.waitN > 0, b.entryKeys(l), args...)
	return b.entryResult("renew", l, reply, waitErr, err)
}

// releaseEntry is Release of a lease from AcquireMode: the entry and its
// intents are deleted, and the release is published on the key's channel
// and each ancestor's.
func (b *Backend) releaseEntry(ctx context.Context, l backend.Lease) error {
	if err := b.validateEntry(l); err != nil {
		return err
	}
	args := make([]any, 0, 4+len(l.Entry.Ancestors))
	args = append(args, l.HolderID, l.Token, b.publishCmd, b.channel(l.Key))
	for _, a := range l.Entry.Ancestors {
		args = append(args, b.channel(a))
	}
	reply, _, err := b.run(ctx, releaseEntryScript, false, b.entryKeys(l), args...)
	return b.entryResult("release", l, reply, nil, err)
}

// setEntryMetadata is SetMetadata of a lease from AcquireMode.
func (b *Backend) setEntryMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	args := make([]any, 0, 2+2*len(md))
	args = append(args, l.HolderID, l.Token)
	for k, v := range md {
		args = append(args, k, v)
	}
	reply, _, err := b.run(ctx, setEntryMetadataScript, false, []string{b.keyBase(l.Key)}, args...)
	return b.entryResult("set metadata", l, reply, nil, err)
}

// entryResult turns the reply of an entry's owner-checked script into the
// error of op.
func (b *Backend) entryResult(op string, l backend.Lease, reply []any, waitErr, err error) error {
	if err != nil {
		return fmt.Errorf("redisbackend: %s %q: %w", op, l.Key, err)
	}
	status, err := checkStatus(op, l.Key, reply)
	if err != nil {
		return err
	}
	switch status {
	case "OK":
		if waitErr != nil {
			return fmt.Errorf("redisbackend: %s %q: %w", op, l.Key, waitErr)
		}
		return nil
	case "LOST":
		return fmt.Errorf("redisbackend: %s %q (%v, term %d): %w", op, l.Key, l.Entry.Mode, l.Term, backend.ErrLeaseLost)
	}
	return fmt.Errorf("redisbackend: %s %q: unexpected reply %#v", op, l.Key, reply)
}

// parseHeld decodes the reply of a failed acquisition of key: HELD (or
// HELDM), the number of waiters yielded to, the number of conflicting
// records, those records, then possibly the key's (or, when it yielded to an
// ancestor's Exclusive waiters, that ancestor's) oldest holder, which stands
// in for Holder when no record conflicts (the acquisition yielded to waiters
// only), or the ancestor's key alone, a string, when the ancestor has no
// holder.
func parseHeld(key string, reply []any) (*backend.HeldError, error) {
	if len(reply) < 3 {
		return nil, fmt.Errorf("short reply %#v", reply)
	}
	n := int(num(reply[2]))
	if n < 0 || len(reply) < 3+n {
		return nil, fmt.Errorf("bad reply %#v", reply)
	}
	if n == 0 && len(reply) == 4 {
		if above, ok := reply[3].(string); ok {
			return &backend.HeldError{Waiting: int(max(0, num(reply[1]))), Holder: backend.Record{Key: above}}, nil
		}
	}
	recs, err := parseRecords(key, reply[3:])
	if err != nil {
		return nil, err
	}
	herr := &backend.HeldError{Waiting: int(max(0, num(reply[1])))}
	if n > 0 {
		herr.Holders = recs[:n]
		herr.Holder = recs[0]
	} else if len(recs) > 0 {
		herr.Holder = recs[0]
	} else {
		herr.Holder = backend.Record{Key: key}
	}
	return herr, nil
}

// parseRecords decodes record replies (see modes_scripts.go); a record
// without a key is key's.
func parseRecords(key string, reply []any) ([]backend.Record, error) {
	recs := make([]backend.Record, 0, len(reply))
	for _, v := range reply {
		r, ok := v.([]any)
		if !ok || len(r) < 12 {
			return nil, fmt.Errorf("bad record reply %#v", v)
		}
		k := cmp.Or(str(r[0]), key)
		term, err := parseStoredTerm(k, r[3])
		if err != nil {
			return nil, err
		}
		rec := backend.Record{
			Key:        k,
			HolderID:   str(r[1]),
			Token:      str(r[2]),
			Term:       term,
			AcquiredAt: time.UnixMilli(num(r[4])),
			RenewedAt:  time.UnixMilli(num(r[5])),
			TTL:        millis(max(0, num(r[6]))),
		}
		if str(r[7]) == "s" {
			rec.Mode = backend.Shared
			rec.Limit = int(max(0, num(r[8])))
		}
		if at, ttl, pttl := num(r[9]), num(r[10]), num(r[11]); at >= 0 && pttl >= 0 {
			rec.HeartbeatAt = time.UnixMilli(at)
			rec.HeartbeatAge = millis(max(0, ttl-pttl))
		}
		if meta := r[12:]; len(meta) >= 2 {
			rec.Metadata = make(map[string]string, len(meta)/2)
			for i := 0; i+1 < len(meta); i += 2 {
				rec.Metadata[str(meta[i])] = str(meta[i+1])
			}
		}
		recs = append(recs, rec)
	}
	return recs, nil
}
