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
// routes it, and the arguments all of them (nodeLua). The keys are put on
// masters by the Cluster client's slot map; an item whose key the node
// does not serve (the map was stale, or the slot is moving) answers MOVED
// and goes again in a script of its slot, which the Cluster client routes
// and redirects as it does every command, as does every item of a node
// script that failed as a whole with a reply of the server (a key that
// left between two calls of an item, say). A call whose first key moved
// is redirected whole by the Cluster client, and its other items answer
// MOVED where it lands. Each item is its own owner-checked step, as in a
// slot's script, so an item sent twice is renewed (or recorded) twice, no
// more. What this saves is requests (about 13 a second for 10,000
// elections, against 2,300), not CPU: pipelined, a script's own cost is
// small beside its keys' (BenchmarkClusterBatchCPU).

// A batch script's body names its keys $K[i] and their number $nK, its
// arguments $A[i] and their number $nA, and writes "$moved(r)" for the
// check that the key of r, a reply of redis.pcall, is not served here.
// slotLua and nodeLua write them for each kind of script, with no copy of
// the keys or the arguments (a copy into Lua tables cost the servers 0.3
// µs a renewal, as much as the scripts it saved).

// slotLua writes body for the scripts that name every key in KEYS (a
// single server, a Cluster slot), which are all served where the script
// runs.
func slotLua(body string) string {
	return strings.NewReplacer("$K[", "KEYS[", "$nK", "#KEYS", "$A[", "ARGV[", "$nA", "#ARGV",
		"$moved(", "false and (").Replace(body)
}

// nodeLua writes body for the scripts of one Cluster master (after
// nodeKeys): KEYS[1] is the first key, which routes the call, ARGV[1] the
// number nk of keys, ARGV[2] to ARGV[nk + 1] the keys (the first again),
// and the script's own arguments follow. A key that is not served there
// fails with an error that is not WRONGTYPE (not_here).
func nodeLua(body string) string {
	return strings.NewReplacer("$K[", "ARGV[1 + ", "$nK", "nk", "$A[", "ARGV[ak + ", "$nA", "(#ARGV - ak)",
		"$moved(", "not_here(").Replace(body)
}

// nodeKeys starts nodeLua's scripts: nk keys, whose arguments begin after
// ak.
const nodeKeys = `
local nk = tonumber(ARGV[1])
local ak = 1 + nk
`

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
// the server (redis.Error; not the network or the context, which a second
// call would meet too).
func resend(err error) bool {
	var re redis.Error
	return errors.Is(err, errMovedItem) || errors.As(err, &re)
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
