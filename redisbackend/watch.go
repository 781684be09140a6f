package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
)

var _ backend.WatchNotifier = (*Backend)(nil)

// errBroken is wrapped by the errors of watches whose pub/sub connection
// broke before the subscription was confirmed.
var errBroken = errors.New("redisbackend: pub/sub connection broken")

// unsubscribeTimeout bounds the write of an UNSUBSCRIBE after the last watch
// of a channel ends.
const unsubscribeTimeout = 5 * time.Second

// hubs holds the shared pub/sub connections of a Backend: one, or one per
// Cluster shard with sharded pub/sub.
type hubs struct {
	mu      sync.Mutex // guards closed, byShard, moved, movedAt, reloadedAt, roleAt, and every hub's subs, started and dead, every sub and every watch
	closed  bool
	byShard map[string]*hub
	wg      sync.WaitGroup // one per running receive loop

	// On a Cluster with sharded pub/sub: moved maps a hash slot to the
	// node that dropped our subscriptions of a channel of that slot (an
	// SUNSUBSCRIBE it sent on its own: the slot moved away from it, in a
	// failover or a resharding); movedAt is when the last such drop
	// arrived, reloadedAt the movedAt that Watch last reloaded the
	// client's slot map for (see clusterShard).
	moved      map[uint16]string
	movedAt    time.Time
	reloadedAt time.Time
	roleAt     map[string]time.Time // node address → when Watch last asked its role (checkMaster)

	// renewalMsgs counts the renewal messages ("renewed:...") the receive
	// loops have read, delivered or not: what a muted watch saves.
	renewalMsgs atomic.Int64
}

func (hs *hubs) init() {
	hs.byShard = make(map[string]*hub)
	hs.moved = make(map[uint16]string)
	hs.roleAt = make(map[string]time.Time)
}

// roleCheckEvery bounds how often Watch asks a Cluster node whether it is
// still a master (checkMaster): at most once a second per node.
const roleCheckEvery = time.Second

// errSlotMoving is wrapped by the error of a Watch on a Cluster whose
// channel's slot a node has just given up while the client's slot map
// still names that node: the caller watches again a little later.
var errSlotMoving = errors.New("redisbackend: the slot moved away from the node the cluster's slot map names")

// hub is one pub/sub connection and the subscriptions multiplexed on it.
type hub struct {
	shard   string        // node address on Cluster with sharded pub/sub, "" otherwise
	node    *redis.Client // that node's client (for its role), nil otherwise
	sharded bool
	ps      *redis.PubSub

	// wsem (capacity 1) serialises each (un)subscribe decision with the
	// write that carries it out, so the server sees them in the order they
	// were decided. It is a channel so that Watch can give up waiting.
	wsem chan struct{}

	subs    map[string]*sub // by channel
	started bool            // the receive loop runs
	dead    bool            // broken or closed; never reused

	remutes  []*watch // whose muted switch changed, for remuteLoop
	remuting bool     // remuteLoop runs

	// beacon is a muted watch whose renewals channel stays subscribed
	// though no watch wants its messages (nil: none): the first muted
	// watch to leave its channel, until it closes. Its holder's renewals
	// (one message per renewal interval, whatever the number of leaders
	// on h) keep the connection from falling silent, so an idle leader's
	// connection is not pinged (see receive); they are read and dropped.
	beacon *watch
}

// beaconChannel is the renewals channel kept for h.beacon, or "".
func (h *hub) beaconChannel() string {
	if h.beacon == nil {
		return ""
	}
	return h.beacon.rchannel
}

// sub is one channel subscription and the watches it feeds.
type sub struct {
	confirmed bool
	ready     chan struct{} // closed on confirmation or failure
	err       error         // why it failed; set before ready is closed
	watches   map[*watch]struct{}
}

// watch is one Watch call's channel. It is one of the watches of the sub
// of its key's events channel and, while it wants renewal events
// (WatchRenewals, not muted), of the sub of its renewals channel.
type watch struct {
	key    string
	ch     chan backend.Event
	notify func() // called after each send and after the close; nil for none
	// renewals: deliver EventRenewed (WatchRenewals); other watches skip
	// renewal messages.
	renewals bool
	muted    *backend.Mute // WatchRenewalsMuted: no renewal events while set; nil for none
	h        *hub
	channel  string // the key's events channel
	rchannel string // the key's renewals channel; "" without renewals
	inR      bool   // w is one of h.subs[rchannel]'s watches
	queued   bool   // w is in h.remutes
	live     bool   // established: a change of muted is acted on (remuteLoop)
	closed   bool
	stop     func() bool // stops the context.AfterFunc that ends the watch
	unhook   func()      // unregisters the muted.OnChange of w; nil for none
}

// Watch implements backend.Watcher. It returns once the server has confirmed
// the subscription, so any Acquire or Release that starts after Watch returns
// is delivered (as EventChanged or EventReleased). Lease expiry is not
// reported. The channel is closed when ctx ends, when the backend is closed,
// or when the shared pub/sub connection breaks or stays silent past two
// health-check intervals; the caller then reads the state and watches again.
// Events never block the backend: a full channel drops new events while the
// buffered ones are pending.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return b.WatchNotify(ctx, key, nil)
}

// WatchNotify implements backend.WatchNotifier: it is Watch, and the shared
// connection's receive loop calls notify after every event it sends (or
// drops) on the channel, and whoever closes the channel calls it after
// closing it.
func (b *Backend) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	return b.watch(ctx, key, notify, false, nil)
}

// WatchRenewals implements backend.RenewalWatcher: it is WatchNotify, and
// it also delivers an EventRenewed for each renewal of the key's lease
// (Renew and RenewBatch publish "renewed:<term>:<ttl ms>" on the key's
// renewals channel, "<lease key>:renewals", which only these watches
// subscribe to besides the key's channel), of an entry of backend.Modes on
// the key, and of an entry below it whose intent on the key the renewal
// extends (Renew of an entry publishes on the key's renewals channel and
// each ancestor's). Events carry the term (released ones too). A renewal
// message on the key's channel, as a version before the renewals channel
// published them, is delivered too.
func (b *Backend) WatchRenewals(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	return b.watch(ctx, key, notify, true, nil)
}

// WatchRenewalsMuted implements backend.RenewalMuter: WatchRenewals, with no
// renewal event while muted is set. A muted watch is not subscribed to the
// key's renewals channel: setting muted unsubscribes the connection from it
// unless another watch of the key in this Backend wants renewals (the
// follower of an election whose leader is in the same process), and
// clearing it subscribes again. Both happen in the background, a moment
// after the change; until then the receive loop drops renewal messages of
// a muted watch (and a renewal published before the subscription is
// confirmed is not delivered: see backend.RenewalMuter for why a watch
// that has just stopped holding the key loses nothing by it). A failed
// (un)subscription breaks the shared connection, as a failed Watch does:
// every watch on it is closed and its receiver watches again, so a watch
// never stays open without the renewals it wants.
func (b *Backend) WatchRenewalsMuted(ctx context.Context, key string, notify func(), muted *backend.Mute) (<-chan backend.Event, error) {
	return b.watch(ctx, key, notify, true, muted)
}

// watch is WatchNotify, with renewal events when renewals is true, unless
// muted (when not nil) is set.
func (b *Backend) watch(ctx context.Context, key string, notify func(), renewals bool, muted *backend.Mute) (<-chan backend.Event, error) {
	if err := b.beginKey(ctx, key); err != nil {
		return nil, err
	}
	if b.pubsub == PubSubOff {
		return nil, fmt.Errorf("redisbackend: watch %q: pub/sub is off: %w", key, errors.ErrUnsupported)
	}
	channel, rchannel := b.channel(key), ""
	if renewals {
		rchannel = b.renewalsChannel(key) // in channel's slot: on channel's shard
	}
	shard := ""
	var node *redis.Client
	if b.pubsub == PubSubSharded && b.cluster != nil {
		var err error
		if shard, node, err = b.clusterShard(ctx, channel); err != nil {
			return nil, fmt.Errorf("redisbackend: watch %q: %w", key, err)
		}
	}
	h, err := b.hubFor(shard, node)
	if err != nil {
		return nil, fmt.Errorf("redisbackend: watch %q: %w", key, err)
	}
	w := &watch{key: key, ch: make(chan backend.Event, b.watchBuffer), notify: notify, renewals: renewals, muted: muted,
		h: h, channel: channel, rchannel: rchannel}

	select {
	case h.wsem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("redisbackend: watch %q: %w", key, ctx.Err())
	}
	b.hubs.mu.Lock()
	if h.dead {
		b.hubs.mu.Unlock()
		<-h.wsem
		return nil, fmt.Errorf("redisbackend: watch %q: %w", key, b.deadErr())
	}
	var writes []string // the channels to subscribe to
	var waits []*sub    // the subscriptions to wait for
	join := func(c string) {
		s := h.subs[c]
		if s == nil {
			s = &sub{ready: make(chan struct{}), watches: make(map[*watch]struct{})}
			h.subs[c] = s
			writes = append(writes, c)
		}
		s.watches[w] = struct{}{}
		waits = append(waits, s)
	}
	join(channel)
	if renewals && (muted == nil || !muted.Load()) {
		join(rchannel)
		w.inR = true
	}
	b.hubs.mu.Unlock()
	if len(writes) == 0 {
		<-h.wsem
	} else if err := b.bounded(ctx, func(ctx context.Context) error { return b.subscribe(ctx, h, writes...) }); err != nil {
		b.removeWatch(w)
		return nil, fmt.Errorf("redisbackend: watch %q: subscribe: %w", key, err)
	}

	for _, s := range waits {
		select {
		case <-s.ready:
			if s.err != nil {
				b.removeWatch(w)
				return nil, fmt.Errorf("redisbackend: watch %q: %w", key, s.err)
			}
		case <-ctx.Done():
			b.removeWatch(w)
			return nil, fmt.Errorf("redisbackend: watch %q: %w", key, ctx.Err())
		}
	}
	stop := context.AfterFunc(ctx, func() { b.removeWatch(w) })
	b.hubs.mu.Lock()
	if w.closed {
		b.hubs.mu.Unlock()
		stop()
		return w.ch, nil
	}
	w.stop = stop
	w.live = true
	b.hubs.mu.Unlock()
	if muted != nil {
		unhook := muted.OnChange(func() { b.remuteLater(w) })
		b.hubs.mu.Lock()
		if w.closed {
			b.hubs.mu.Unlock()
			unhook()
			return w.ch, nil
		}
		w.unhook = unhook
		b.hubs.mu.Unlock()
		b.remuteLater(w) // muted may have changed before OnChange
	}
	return w.ch, nil
}

// remuteLater queues w for its hub's remute loop (starting it when it does
// not run) unless w's subscription of its renewals channel already matches
// its muted switch, or w is queued already. It is muted's OnChange hook: it
// does not block.
func (b *Backend) remuteLater(w *watch) {
	b.hubs.mu.Lock()
	defer b.hubs.mu.Unlock()
	h := w.h
	if !w.live || w.closed || w.queued || h.dead || b.hubs.closed || w.inR != w.muted.Load() {
		return
	}
	w.queued = true
	h.remutes = append(h.remutes, w)
	if !h.remuting {
		h.remuting = true
		b.hubs.wg.Add(1) // closeAll waits for it; none is added once closed is set
		go b.remuteLoop(h)
	}
}

// remuteLoop makes each queued watch one of the watches of its renewals
// channel's sub when its muted switch is clear, and removes it from them
// when it is set: the first watch of a channel subscribes to it, the last
// one's leaving unsubscribes. It takes the queue in batches, each decided
// holding h.wsem and written in one (UN)SUBSCRIBE of all its channels
// (with sharded pub/sub, one per channel: a command's channels must share
// a slot), so that 10,000 leaders muting at once cost a few writes, not
// 10,000. A watch is taken off the queue before its switch is read, so a
// change after that queues it again. A failed write breaks the hub,
// closing its watches. It returns when the queue is empty.
func (b *Backend) remuteLoop(h *hub) {
	defer b.hubs.wg.Done()
	for {
		h.wsem <- struct{}{}
		b.hubs.mu.Lock()
		batch := h.remutes
		h.remutes = nil
		if len(batch) == 0 || h.dead {
			h.remuting = false
			b.hubs.mu.Unlock()
			<-h.wsem
			return
		}
		var subscribe, unsubscribe []string
		for _, w := range batch {
			w.queued = false
			want := !w.muted.Load()
			if w.closed || want == w.inR {
				continue
			}
			s := h.subs[w.rchannel]
			if want {
				if s == nil {
					s = &sub{ready: make(chan struct{}), watches: make(map[*watch]struct{})}
					h.subs[w.rchannel] = s
					subscribe = append(subscribe, w.rchannel)
				}
				s.watches[w] = struct{}{}
				w.inR = true
				continue
			}
			w.inR = false
			if s == nil {
				continue
			}
			delete(s.watches, w)
			if len(s.watches) > 0 {
				continue
			}
			if h.beacon == nil && !b.noBeacon {
				h.beacon = w
			}
			if h.beaconChannel() == w.rchannel {
				continue // kept (see hub.beacon)
			}
			// A pending one is unsubscribed when its confirmation
			// arrives (confirm).
			if s.confirmed {
				delete(h.subs, w.rchannel)
				unsubscribe = append(unsubscribe, w.rchannel)
			}
		}
		b.hubs.mu.Unlock()
		err := b.writeBatch(h, subscribe, unsubscribe)
		<-h.wsem
		if err != nil {
			b.breakHub(h, err)
		}
	}
}

// commands returns h's (S)SUBSCRIBE and (S)UNSUBSCRIBE: the sharded ones
// with sharded pub/sub.
func (h *hub) commands() (sub, unsub func(context.Context, ...string) error) {
	if h.sharded {
		return h.ps.SSubscribe, h.ps.SUnsubscribe
	}
	return h.ps.Subscribe, h.ps.Unsubscribe
}

// writeBatch writes the (S)SUBSCRIBE of subscribe and the (S)UNSUBSCRIBE
// of unsubscribe, which the caller has decided holding h.wsem.
func (b *Backend) writeBatch(h *hub, subscribe, unsubscribe []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
	defer cancel()
	write := func(f func(context.Context, ...string) error, channels []string) error {
		if len(channels) == 0 {
			return nil
		}
		if !h.sharded {
			return f(ctx, channels...)
		}
		for _, c := range channels {
			if err := f(ctx, c); err != nil {
				return err
			}
		}
		return nil
	}
	sub, unsub := h.commands()
	if err := write(sub, subscribe); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if err := write(unsub, unsubscribe); err != nil {
		return fmt.Errorf("unsubscribe: %w", err)
	}
	return nil
}

// clusterShard returns the address of the master that serves channel's
// slot, where a sharded subscription of channel must go: a replica accepts
// one (SSUBSCRIBE) but does not deliver what is published on its master,
// so a subscription sent there would stay silent. The client's slot map
// may be out of date after a failover or a resharding; the nodes that gave
// up a slot tell the subscribers they had there (SUNSUBSCRIBE, see
// serverUnsubscribed). After such a drop the map is reloaded before the
// next subscription (ForEachMaster reloads it), and a subscription of a
// slot whose node dropped it is refused (errSlotMoving) while the map still
// names that node, as it may for a moment when the node asked has not yet
// learnt of the move (TestClusterWatchAcrossFailover). A node that had no
// subscription of ours when it became a replica sends no such drop: the
// node's role is checked before a subscription (checkMaster, at most once
// a second), and while a subscription stays silent (see receive), so that
// a subscription sent to a replica is noticed and made again on the master
// (TestClusterWatchAfterUnseenFailover). It returns the node's address and
// client.
func (b *Backend) clusterShard(ctx context.Context, channel string) (string, *redis.Client, error) {
	slot := keySlot(channel)
	b.hubs.mu.Lock()
	from := b.hubs.moved[slot]
	reload := b.hubs.movedAt.After(b.hubs.reloadedAt)
	if reload {
		b.hubs.reloadedAt = b.hubs.movedAt
	}
	b.hubs.mu.Unlock()
	if reload || from != "" {
		if err := b.reloadSlots(ctx); err != nil {
			return "", nil, err
		}
	}
	node, err := b.cluster.MasterForKey(ctx, channel)
	if err != nil {
		return "", nil, err
	}
	addr := node.Options().Addr
	if from != "" {
		if addr == from {
			return "", nil, fmt.Errorf("%w: slot %d left %s", errSlotMoving, slot, from)
		}
		b.hubs.mu.Lock()
		if b.hubs.moved[slot] == from {
			delete(b.hubs.moved, slot)
		}
		b.hubs.mu.Unlock()
	}
	if err := b.checkMaster(ctx, addr, node, slot); err != nil {
		return "", nil, err
	}
	return addr, node, nil
}

// checkMaster asks the node at addr (node) whether it is a master (ROLE),
// unless it was asked less than roleCheckEvery ago. When it is not, the
// slot map is out of date: the next Watch reloads it, and slot (whose
// subscription was to go there) is treated as moved away from addr, so
// that it returns errSlotMoving.
func (b *Backend) checkMaster(ctx context.Context, addr string, node *redis.Client, slot uint16) error {
	if b.noRole.Load() {
		return nil
	}
	now := time.Now()
	b.hubs.mu.Lock()
	due := now.Sub(b.hubs.roleAt[addr]) >= roleCheckEvery
	if due {
		b.hubs.roleAt[addr] = now
	}
	b.hubs.mu.Unlock()
	if !due {
		return nil
	}
	master, err := isMaster(ctx, node)
	var refused redis.Error
	switch {
	case errors.As(err, &refused):
		// An answer, but not the role: an ACL user without ROLE, or a
		// server without it. The check is skipped from now on, and
		// subscriptions go where the slot map says.
		b.noRole.Store(true)
		return nil
	case err != nil:
		b.hubs.mu.Lock()
		delete(b.hubs.roleAt, addr) // ask again next time
		b.hubs.mu.Unlock()
		return fmt.Errorf("the role of %s: %w", addr, err)
	}
	if master {
		return nil
	}
	b.hubs.mu.Lock()
	b.movedLocked(slot, addr)
	b.hubs.mu.Unlock()
	return fmt.Errorf("%w: %s is no longer a master (slot %d)", errSlotMoving, addr, slot)
}

// isMaster reports whether the node of c answers ROLE with master.
func isMaster(ctx context.Context, c *redis.Client) (bool, error) {
	role, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return false, err
	}
	return len(role) > 0 && role[0] == "master", nil
}

// movedLocked notes that slot has moved away from the node at addr (it
// dropped our subscriptions there, or is no longer a master): the next
// Watch reloads the slot map, and one of slot refuses addr until the map
// names another node (see clusterShard). The caller holds b.hubs.mu.
func (b *Backend) movedLocked(slot uint16, addr string) {
	b.hubs.moved[slot] = addr
	b.hubs.movedAt = time.Now()
}

func (b *Backend) deadErr() error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	return errBroken
}

// hubFor returns the live hub of shard, creating it (without connecting)
// when there is none.
func (b *Backend) hubFor(shard string, node *redis.Client) (*hub, error) {
	b.hubs.mu.Lock()
	defer b.hubs.mu.Unlock()
	if b.hubs.closed {
		return nil, backend.ErrClosed
	}
	if h := b.hubs.byShard[shard]; h != nil {
		return h, nil
	}
	h := &hub{shard: shard, node: node, sharded: b.pubsub == PubSubSharded, subs: make(map[string]*sub), wsem: make(chan struct{}, 1)}
	// Without channels, neither call connects: the first (S)SUBSCRIBE does,
	// to the node that serves its channel.
	if h.sharded {
		h.ps = b.client.SSubscribe(context.Background())
	} else {
		h.ps = b.client.Subscribe(context.Background())
	}
	b.hubs.byShard[shard] = h
	return h, nil
}

// subscribe writes the (S)SUBSCRIBE of channels (one command: on Cluster,
// they are in one slot), which the caller has decided holding h.wsem, and
// releases h.wsem. It starts the receive loop after the first
// subscription, so that the connection is opened by a subscription (on
// Cluster, to the node that serves the channels). A failed write breaks
// the hub.
func (b *Backend) subscribe(ctx context.Context, h *hub, channels ...string) error {
	sub, _ := h.commands()
	err := sub(ctx, channels...)
	if err == nil {
		b.hubs.mu.Lock()
		if !h.started && !h.dead {
			h.started = true
			b.hubs.wg.Add(1)
			go b.receive(h)
		}
		b.hubs.mu.Unlock()
	}
	<-h.wsem
	if err != nil {
		b.breakHub(h, err)
	}
	return err
}

// removeWatch ends w: closes its channel and unsubscribes each of its
// channels of which it was the last watch on a confirmed subscription. (A
// pending one is unsubscribed when its confirmation arrives.)
func (b *Backend) removeWatch(w *watch) {
	h := w.h
	b.hubs.mu.Lock()
	closeWatch(w)
	var idle []string
	var subs []*sub
	beacon := h.beacon == w
	if beacon {
		h.beacon = nil
	}
	for _, c := range []string{w.channel, w.rchannel} {
		s := h.subs[c]
		if c == "" || s == nil {
			continue
		}
		if _, ok := s.watches[w]; !ok {
			continue
		}
		delete(s.watches, w)
		if len(s.watches) == 0 && s.confirmed && !h.dead {
			idle, subs = append(idle, c), append(subs, s)
		}
	}
	if beacon && !w.inR { // its renewals channel, kept for it alone
		if s := h.subs[w.rchannel]; s != nil && len(s.watches) == 0 && s.confirmed && !h.dead {
			idle, subs = append(idle, w.rchannel), append(subs, s)
		}
	}
	w.inR = false
	b.hubs.mu.Unlock()
	for i, c := range idle {
		b.unsubscribeIfIdle(h, c, subs[i])
	}
}

// unsubscribeIfIdle unsubscribes channel if s is still its subscription and
// still has no watches.
func (b *Backend) unsubscribeIfIdle(h *hub, channel string, s *sub) {
	h.wsem <- struct{}{}
	defer func() { <-h.wsem }()
	b.hubs.mu.Lock()
	idle := h.subs[channel] == s && len(s.watches) == 0 && s.confirmed && !h.dead && channel != h.beaconChannel()
	if idle {
		delete(h.subs, channel)
	}
	b.hubs.mu.Unlock()
	if !idle {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
	defer cancel()
	b.unsubscribe(ctx, h, channel)
}

// unsubscribe writes the (S)UNSUBSCRIBE of channel, which the caller has
// decided holding h.wsem. A failed write breaks the hub: the server may
// still send what is published on channel, and the connection's state is
// no longer known.
func (b *Backend) unsubscribe(ctx context.Context, h *hub, channel string) {
	_, unsub := h.commands()
	if err := unsub(ctx, channel); err != nil {
		b.breakHub(h, fmt.Errorf("unsubscribe %s: %w", channel, err))
	}
}

// closeWatch closes w's channel; the caller holds b.hubs.mu, and removes w
// from the subs it is in (or drops them).
func closeWatch(w *watch) {
	if w.closed {
		return
	}
	w.closed = true
	close(w.ch)
	if w.notify != nil {
		w.notify()
	}
	if w.stop != nil {
		w.stop()
	}
	if w.unhook != nil {
		w.unhook() // takes only the Mute's lock, which no hook holds
	}
}

// pingAnswerTime is how long a ping of a watch connection checked every
// interval may go unanswered: a fifth of the interval, at least 1 second
// and at most the interval.
func pingAnswerTime(interval time.Duration) time.Duration {
	return min(interval, max(interval/5, time.Second))
}

// receive is the receive loop of h. It runs until the connection breaks or
// the backend closes.
//
// The connection must not stay silent for more than two health-check
// intervals: that is how long a server that stops answering without
// closing the connection (frozen, its host gone, a network path lost) may
// go unnoticed. A quiet connection is pinged after two intervals less the
// ping's answer time (b.pingAnswer) and broken if the answer does not come
// within that time, so the bound holds with one ping per silence rather
// than one per interval: at the default 15 s, a ping after 27 s of silence
// answered within 3 s (about 2.2 a minute instead of 4; a live server
// answers a PING in well under a millisecond, and one that takes 3 s has
// already failed the elector's requests, which time out after TTL/5, 2 s
// at the default TTL). A dead or hung server is noticed within two
// intervals as before, on average sooner (half the silence plus the answer
// time: 16.5 s instead of 22.5 s). Any message read counts as an answer.
func (b *Backend) receive(h *hub) {
	defer b.hubs.wg.Done()
	silence := max(2*b.healthCheck-b.pingAnswer, b.healthCheck)
	var pingedAt time.Time // zero unless a ping awaits its answer
	for {
		wait := silence
		if !pingedAt.IsZero() {
			wait = max(b.pingAnswer-time.Since(pingedAt), time.Millisecond)
		}
		msg, err := h.ps.ReceiveTimeout(context.Background(), wait)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && pingedAt.IsZero() {
				if b.demoted(h) {
					return
				}
				pingedAt = time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), b.pingAnswer)
				err = h.ps.Ping(ctx)
				cancel()
				if err == nil {
					continue
				}
			}
			b.breakHub(h, err)
			return
		}
		pingedAt = time.Time{}
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				b.confirm(h, m.Channel)
			case "sunsubscribe":
				b.serverUnsubscribed(h, m.Channel)
			}
		case *redis.Message:
			b.dispatch(h, m.Channel, m.Payload)
		}
	}
}

// demoted reports whether h's node, on a Cluster, answers that it is no
// longer a master, and then breaks h and notes its channels' slots as moved
// away from it (see clusterShard): a replica accepts subscriptions and
// delivers nothing published on its master, so a silent connection to one
// is a subscription that will stay silent. An error asking is not an
// answer: the ping that follows checks the connection.
func (b *Backend) demoted(h *hub) bool {
	if h.node == nil || b.noRole.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.pingAnswer)
	master, err := isMaster(ctx, h.node)
	cancel()
	if err != nil || master {
		return false
	}
	b.hubs.mu.Lock()
	for channel := range h.subs {
		b.movedLocked(keySlot(channel), h.shard)
	}
	b.hubs.mu.Unlock()
	b.breakHub(h, fmt.Errorf("%w: %s is no longer a master", errSlotMoving, h.shard))
	return true
}

// confirm marks the subscription of channel as established and wakes the
// Watch calls waiting for it.
func (b *Backend) confirm(h *hub, channel string) {
	b.hubs.mu.Lock()
	s := h.subs[channel]
	if s == nil || s.confirmed {
		b.hubs.mu.Unlock()
		return
	}
	s.confirmed = true
	close(s.ready)
	empty := len(s.watches) == 0 && channel != h.beaconChannel()
	b.hubs.mu.Unlock()
	if empty { // every watch gave up while the subscription was pending
		b.unsubscribeIfIdle(h, channel, s)
	}
}

// serverUnsubscribed handles an SUNSUBSCRIBE the server sent on its own
// (its slot moved to another node): the watches on channel and on the
// other channel of its key (events or renewals, in the same slot, which
// the server drops too) are closed, so their callers watch again on the
// right node. Replies to our own unsubscriptions find no confirmed
// subscription and are ignored.
func (b *Backend) serverUnsubscribed(h *hub, channel string) {
	b.hubs.mu.Lock()
	defer b.hubs.mu.Unlock()
	s := h.subs[channel]
	if s == nil || !s.confirmed {
		return
	}
	if h.shard != "" {
		b.movedLocked(keySlot(channel), h.shard)
	}
	for _, c := range []string{channel, siblingChannel(channel)} {
		s := h.subs[c]
		if c == "" || s == nil {
			continue
		}
		delete(h.subs, c)
		if c == h.beaconChannel() {
			h.beacon = nil
		}
		if !s.confirmed {
			s.err = fmt.Errorf("%w: slot %d left %s", errSlotMoving, keySlot(c), h.shard)
			s.confirmed = true
			close(s.ready)
		}
		for w := range s.watches {
			closeWatch(w)
			w.inR = false
		}
	}
}

// dispatch delivers a notification to every watch of channel without
// blocking.
func (b *Backend) dispatch(h *hub, channel, payload string) {
	typ := backend.EventChanged
	var (
		ttl  time.Duration
		term uint64
	)
	switch {
	case strings.HasPrefix(payload, "released:"):
		typ = backend.EventReleased
		term, _ = strconv.ParseUint(payload[len("released:"):], 10, 64) // 0: unknown
	case strings.HasPrefix(payload, "expired:"):
		typ = backend.EventExpired
	case strings.HasPrefix(payload, "renewed:"):
		b.hubs.renewalMsgs.Add(1)
		// renewed:<term>:<ttl ms>. A malformed one is a change to look at.
		if i := strings.LastIndexByte(payload, ':'); i > len("renewed") {
			if ms, err := strconv.ParseInt(payload[i+1:], 10, 64); err == nil && ms > 0 {
				typ, ttl = backend.EventRenewed, time.Duration(ms)*time.Millisecond
				term, _ = strconv.ParseUint(payload[len("renewed:"):i], 10, 64)
			}
		}
	}
	b.hubs.mu.Lock()
	defer b.hubs.mu.Unlock()
	s := h.subs[channel]
	if s == nil {
		return
	}
	for w := range s.watches {
		if w.closed || (typ == backend.EventRenewed && (!w.renewals || (w.muted != nil && w.muted.Load()))) {
			continue
		}
		select {
		case w.ch <- backend.Event{Key: w.key, Type: typ, TTL: ttl, Term: term}:
		default: // full: the pending events already tell the receiver to look
		}
		if w.notify != nil {
			w.notify()
		}
	}
}

// breakHub retires h after a connection failure: pending Watch calls fail,
// every watch channel is closed, and the next Watch opens a new connection.
func (b *Backend) breakHub(h *hub, cause error) {
	b.hubs.mu.Lock()
	if h.dead {
		b.hubs.mu.Unlock()
		return
	}
	b.retireLocked(h, fmt.Errorf("%w: %w", errBroken, cause))
	b.hubs.mu.Unlock()
	_ = h.ps.Close()
}

// retireLocked marks h dead, fails its pending subscriptions with err and
// closes its watches. The caller holds b.hubs.mu and closes h.ps afterwards.
func (b *Backend) retireLocked(h *hub, err error) {
	h.dead = true
	if b.hubs.byShard[h.shard] == h {
		delete(b.hubs.byShard, h.shard)
	}
	for _, s := range h.subs {
		if !s.confirmed {
			s.err = err
			close(s.ready)
			s.confirmed = true
		}
		for w := range s.watches {
			closeWatch(w)
		}
	}
	h.subs = make(map[string]*sub)
}

// closeAll retires every hub and waits for their receive loops.
func (hs *hubs) closeAll(b *Backend) {
	hs.mu.Lock()
	hs.closed = true
	var all []*hub
	for _, h := range hs.byShard {
		all = append(all, h)
	}
	for _, h := range all {
		b.retireLocked(h, backend.ErrClosed)
	}
	hs.mu.Unlock()
	for _, h := range all {
		_ = h.ps.Close()
	}
	hs.wg.Wait()
}
