package redisbackend

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Batches on a Redis Cluster, one script per master.
//
// A Cluster routes a command by its keys, which must share one hash slot
// (CROSSSLOT otherwise), so a batch script that names its keys in KEYS
// serves one slot: 10,000 keys fall in about 7,500 of the 16,384 slots, so
// an instance holding 10,000 leases sent about 7,500 scripts an interval.
// A script sent with EVAL or EVALSHA and no shebang line (the compatibility
// mode every script here is in) may also touch keys that it does not name,
// in any slot the node serves: Redis checks only that each key it touches
// is served there, and a call on a key that is not fails with an error
// ("Script attempted to access a non local key in a cluster node", also
// for a key of a slot being migrated away that has already left). So on a
// Cluster the batch scripts go one per master (renewManyNodeScript,
// heartbeatManyNodeScript): KEYS holds the first key of the call, which
// routes it, and the arguments the others (nodeKeys). The keys are put on
// masters by the Cluster client's slot map; an item whose key the node
// does not serve (the map was stale, or the slot is moving) answers MOVED
// and goes again in a script of its slot, which the Cluster client routes
// and redirects as it does every command, as does every item of a node
// script that failed as a whole with a reply of the server (a slot that
// moved under its first key, a key that left in the middle of an item).
// Each item is its own owner-checked step, as in a slot's script, so an
// item sent twice is renewed (or recorded) twice, no more.

// slotKeys starts the scripts that name every key in KEYS (a single server,
// a Cluster slot): K are the keys, A the arguments.
const slotKeys = `
local K, A = KEYS, ARGV
`

// nodeKeys starts the scripts of one Cluster master: KEYS[1] is the first
// key, ARGV[1] the number n of keys, ARGV[2] to ARGV[n] the others, and the
// script's own arguments follow.
const nodeKeys = `
local n = tonumber(ARGV[1])
local K, A = {KEYS[1]}, {}
for i = 2, n do K[i] = ARGV[i] end
for i = n + 1, #ARGV do A[#A + 1] = ARGV[i] end
`

// slotLua and nodeLua write the check "$moved(r)" of a batch script's body
// for its mode: never in a slot's script, whose keys are all served where
// it runs; in a node's script, r is an error that is not WRONGTYPE (a key
// of ours holds foreign data), so the key is not served there.
func slotLua(body string) string { return strings.ReplaceAll(body, "$moved(", "false and (") }
func nodeLua(body string) string {
	return strings.ReplaceAll(body, "$moved(", "not_here(")
}

// luaNotHere defines not_here for nodeLua's scripts.
const luaNotHere = `
local function not_here(r)
  return failed(r) and string.sub(r['err'], 1, 9) ~= 'WRONGTYPE'
end
`

// movedStatus is a node script's status of an item whose key the node
// does not serve.
const movedStatus = "MOVED"

// errMovedItem stands for an item of a node script to send again by slot.
var errMovedItem = errors.New("redisbackend: not served by the node")

// resend reports whether an item of a node script must go again in a
// script of its slot: it answered MOVED, or its call failed with a reply of
// the server (not the network or the context, which a second call would
// meet too).
func resend(err error) bool {
	if errors.Is(err, errMovedItem) {
		return true
	}
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// nodeTagger gives the keys of one batch their group on a Cluster: the
// master that serves their slot, by the Cluster client's slot map, asked
// once per slot.
type nodeTagger struct {
	b     *Backend
	ctx   context.Context
	slots map[uint16]int
	nodes map[*redis.Client]int
}

// nodeTag is where the tags of masters begin, above every slot (groupTag).
const nodeTag = 1 << 16

func (b *Backend) newNodeTagger(ctx context.Context) *nodeTagger {
	return &nodeTagger{b: b, ctx: ctx, slots: map[uint16]int{}, nodes: map[*redis.Client]int{}}
}

// tag returns key's group: its master's (nodeTag and above), or, when the
// map names none, its slot's (groupTag), so the key goes in a script of its
// slot.
func (t *nodeTagger) tag(key string) int {
	slot := keySlot(key)
	if g, ok := t.slots[slot]; ok {
		return g
	}
	g := int(slot)
	if node, err := t.b.cluster.MasterForKey(t.ctx, key); err == nil {
		n, ok := t.nodes[node]
		if !ok {
			n = len(t.nodes)
			t.nodes[node] = n
		}
		g = nodeTag + n
	}
	t.slots[slot] = g
	return g
}

// resent returns the items of calls' node scripts that must go again by
// slot (resend).
func resent(calls []batchScriptCall, errs []error) []int {
	var again []int
	for i := range calls {
		if !calls[i].node {
			continue
		}
		for _, item := range calls[i].items {
			if resend(errs[item]) {
				again = append(again, item)
			}
		}
	}
	return again
}
