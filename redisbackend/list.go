package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
)

// listScanCount is the COUNT hint of each SCAN call of List, and so about
// how many names each pipelined read carries.
const listScanCount = 512

// scanner is the part of a client (or of one Cluster or Ring node) List uses.
type scanner interface {
	Pipeline() redis.Pipeliner
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// List implements backend.Backend. It runs SCAN (never KEYS) with a MATCH
// pattern made of the backend's prefix and the given prefix, glob characters
// escaped, on every primary of a *redis.ClusterClient, every shard of a
// *redis.Ring, and on the one server otherwise; after each SCAN batch it
// reads the leases it found with the Get script, in one pipeline, so that
// each record is consistent in itself (its TTL is the lease's PTTL by the
// server's clock). Heartbeat records, term counters and members sets never
// match; a name SCAN returns twice is read once; data of another kind at a
// lease's path, or a hash whose fields do not parse as a lease (a term of
// 0), is skipped. The records are sorted by key. A prefix
// containing '{' or '}' matches no valid key, so the result is empty.
func (b *Backend) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, nil
	}
	var recs []backend.Record
	err := b.bounded(ctx, func(ctx context.Context) error {
		l := &lister{b: b, prefix: prefix, seen: make(map[string]bool)}
		l.pattern = b.listPattern(prefix)
		var err error
		switch c := b.client.(type) {
		case *redis.ClusterClient:
			err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return l.scan(ctx, node) })
		case *redis.Ring:
			err = c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error { return l.scan(ctx, shard) })
		default:
			err = l.scan(ctx, b.client)
		}
		if err != nil {
			return err
		}
		slices.SortFunc(l.recs, func(x, y backend.Record) int { return strings.Compare(x.Key, y.Key) })
		recs = l.recs // read by List only after this function returned
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisbackend: list %q: %w", prefix, err)
	}
	return recs, nil
}

// lister is one List call's state, shared by the scans of every node.
type lister struct {
	b       *Backend
	prefix  string
	pattern string

	mu   sync.Mutex // guards seen, recs
	seen map[string]bool
	recs []backend.Record
}

// scan walks one server's keyspace and reads the leases it finds.
func (l *lister) scan(ctx context.Context, c scanner) error {
	var cursor uint64
	for {
		names, next, err := c.Scan(ctx, cursor, l.pattern, listScanCount).Result()
		if err != nil {
			return fmt.Errorf("SCAN: %w", err)
		}
		var batch []string // lease names not read yet
		var keys []string  // their keys
		l.mu.Lock()
		for _, name := range names {
			key, ok := l.b.leaseKeyOf(name)
			if !ok || !strings.HasPrefix(key, l.prefix) || l.seen[name] {
				continue
			}
			l.seen[name] = true
			batch = append(batch, name)
			keys = append(keys, key)
		}
		l.mu.Unlock()
		if len(batch) > 0 {
			if err := l.read(ctx, c, batch, keys); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// read runs the holders script on every name in one pipeline (a second
// one for the replies that were NOSCRIPT) and keeps the records of every
// live holder: one per plain lease, one per entry of AcquireMode.
func (l *lister) read(ctx context.Context, c scanner, names, keys []string) error {
	cmds := make([]*redis.Cmd, len(names))
	p := c.Pipeline()
	for i := range names {
		cmds[i] = holdersScript.EvalSha(ctx, p, []string{names[i]}, "1")
	}
	_, _ = p.Exec(ctx) // errors are read per command
	var missing []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		p := c.Pipeline()
		for _, i := range missing {
			cmds[i] = holdersScript.Eval(ctx, p, []string{names[i]}, "1")
		}
		_, _ = p.Exec(ctx)
	}
	var recs []backend.Record
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil {
			return fmt.Errorf("reading %q: %w", names[i], err)
		}
		reply, ok := v.([]any)
		if !ok || len(reply) == 0 {
			return fmt.Errorf("reading %q: unexpected script reply %#v", names[i], v)
		}
		if str(reply[0]) != "OK" { // WRONGTYPE: not ours
			continue
		}
		rs, err := parseRecords(keys[i], reply[1:]) // none: gone since SCAN, or intents only
		switch {
		case errors.Is(err, ErrWrongType):
			// A term that does not parse (0, negative, not an integer):
			// another's data at a lease's path, skipped as data of another
			// kind is, so that one such hash does not hide every lease
			// from List (Get on that key reports it).
			continue
		case err != nil:
			return fmt.Errorf("reading %q: %w", names[i], err)
		}
		recs = append(recs, rs...)
	}
	l.mu.Lock()
	l.recs = append(l.recs, recs...)
	l.mu.Unlock()
	return nil
}

// leaseKeyOf returns the key whose lease hash is named name (see keyBase),
// and false when name is not a lease hash's name: a term counter, a
// heartbeat record, a members set, a waiters hash, or another's data.
func (b *Backend) leaseKeyOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, b.prefix+"{")
	if !ok {
		return "", false
	}
	tag, rest, ok := strings.Cut(rest, "}")
	if !ok {
		return "", false
	}
	var key string
	if rest == "" { // an election: <prefix>{<key>}
		if strings.HasPrefix(tag, backend.LockKeyPrefix) {
			return "", false
		}
		key = tag
	} else { // a lock: <prefix>{lock/<root>}{<rest>}
		below, ok := strings.CutPrefix(rest, "{")
		if !ok {
			return "", false
		}
		if below, ok = strings.CutSuffix(below, "}"); !ok {
			return "", false
		}
		root, ok := strings.CutPrefix(tag, backend.LockKeyPrefix)
		if !ok || strings.Contains(root, "/") || (below != "" && below[0] != '/') {
			return "", false
		}
		key = tag + below
	}
	if b.ValidateKey(key) != nil || b.keyBase(key) != name {
		return "", false
	}
	return key, true
}

// listPattern is the SCAN MATCH pattern of List(prefix): the names of the
// lease hashes of keys beginning with prefix, and others that leaseKeyOf
// and the prefix check then drop. A lock prefix that reaches below its
// root's segment ("lock/a/b") matches inside the tree's names; any other
// prefix is matched against the first tag, whose '*' also spans the second
// of lock names.
func (b *Backend) listPattern(prefix string) string {
	if rest, ok := strings.CutPrefix(prefix, backend.LockKeyPrefix); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return globEscape(b.prefix) + "{" + globEscape(backend.LockKeyPrefix+rest[:i]) + "}{" + globEscape(rest[i:]) + "*}"
		}
	}
	return globEscape(b.prefix) + "{" + globEscape(prefix) + "*}"
}

// globEscape escapes the characters SCAN's MATCH pattern treats specially,
// so that s matches only itself.
func globEscape(s string) string {
	var sb strings.Builder
	sb.Grow(len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\':
			sb.WriteByte('\\')
			sb.WriteByte(c)
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}
