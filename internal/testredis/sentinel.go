package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timings of the Sentinel setups. Sentinel's own defaults (an INFO every
// 10 s, the demoted primary reconfigured 8 s after a failover) would make
// every failover take about ten seconds; these make it take one or two.
const (
	// sentinelPeriod is Sentinel's PING and hello period (SENTINEL DEBUG
	// ping-period, publish-period). An old primary that still reports
	// itself primary after a failover is made a replica 4 publish periods
	// later, at its next INFO.
	sentinelPeriod = 100 * time.Millisecond
	// sentinelInfoPeriod is Sentinel's INFO period (SENTINEL DEBUG
	// info-period). Not much shorter: Sentinel promotes only a replica
	// whose last INFO is at most 3 info periods old, while during a
	// failover it sends replicas an INFO only every second; with 100 ms,
	// failovers on a loaded machine aborted with
	// -failover-abort-no-good-slave (Failover starts an aborted one again).
	sentinelInfoPeriod = 500 * time.Millisecond
	// sentinelDownAfter is down-after-milliseconds: how long a node must
	// not answer before Sentinel deems it down.
	sentinelDownAfter = time.Second
	// sentinelFailoverTimeout is failover-timeout. Large, because Sentinel
	// also waits this long before it points a replica that replicates
	// through HoldableReplication's proxy at the primary itself.
	sentinelFailoverTimeout = time.Minute
	// sentinelTiltTrigger is how late Sentinel's timer may run before
	// Sentinel enters TILT mode and stops acting for 30 s: high, so that a
	// loaded test machine does not stall a failover.
	sentinelTiltTrigger = time.Minute
	// sentinelBound is how long StartSentinel waits for the setup to be
	// ready and Failover for a failover to complete.
	sentinelBound = 30 * time.Second
	// sentinelPoll is how often they poll.
	sentinelPoll = 20 * time.Millisecond
)

// SentinelConfig tunes the setup StartSentinel launches. The zero value is
// one primary, one replica and one Sentinel monitoring them as "sovereign".
type SentinelConfig struct {
	// MasterName is the name the Sentinel monitors the primary under.
	// default: "sovereign"
	MasterName string
	// Replicas is the number of replicas. default: 1
	Replicas int
	// HoldableReplication routes the link of every replica to the primary
	// through a proxy in the test process, so that HoldReplication can cut
	// the replication stream while every process stays up and answers.
	// default: false
	HoldableReplication bool
	// Args are extra redis-server arguments of the primary and the replicas.
	Args []string
}

// Sentinel is a Redis Sentinel setup started by StartSentinel: a primary,
// its replicas and one Sentinel (redis-server in sentinel mode) monitoring
// them with quorum 1, each process on a free loopback port with its own
// directory in the test's temporary directory. Its methods are safe for
// concurrent use.
type Sentinel struct {
	name     string
	nodes    []*Server // the data nodes; nodes[0] was the primary at start
	sentinel *Server
	proxies  []*linkProxy // one per replica with HoldableReplication

	sc      *redis.SentinelClient
	clients map[string]*redis.Client // admin clients of the data nodes, by address

	stopOnce sync.Once
}

// StartSentinel starts a primary, cfg.Replicas replicas (--replicaof the
// primary) and a Sentinel monitoring the primary as cfg.MasterName with
// quorum 1, and returns once every replica has finished its first sync and
// the Sentinel knows every replica as a healthy one. Every process is
// stopped at the end of the test, even when the test fails. It starts its
// own processes even when REDIS_ADDR is set, and skips the test loudly,
// like Start, when redis-server cannot be found (fails it when
// SOVEREIGN_REQUIRE_REDIS is set).
//
// The Sentinel runs with short periods (an INFO every 500 ms, a PING every
// 100 ms), so that a failover takes a few seconds rather than ten or more.
func StartSentinel(t testing.TB, cfg SentinelConfig) *Sentinel {
	t.Helper()
	bin := findServerOrSkip(t, "")
	if cfg.MasterName == "" {
		cfg.MasterName = "sovereign"
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	s := &Sentinel{name: cfg.MasterName, clients: make(map[string]*redis.Client)}
	t.Cleanup(s.Stop)

	// No delay before the diskless full sync of a new replica (Redis 7:
	// 5 s), on every node since any of them may become the primary.
	args := append([]string{"--repl-diskless-sync-delay", "0"}, cfg.Args...)
	primary, err := start(bin, t.TempDir(), Config{Args: args})
	if err != nil {
		t.Fatalf("testredis: sentinel setup: primary: %v", err)
	}
	s.nodes = append(s.nodes, primary)
	for i := range cfg.Replicas {
		target := primary.Addr()
		if cfg.HoldableReplication {
			p, err := newLinkProxy(target)
			if err != nil {
				t.Fatalf("testredis: sentinel setup: replication proxy: %v", err)
			}
			s.proxies = append(s.proxies, p)
			target = p.addr()
		}
		host, port, _ := net.SplitHostPort(target)
		replica, err := start(bin, t.TempDir(), Config{Args: append(slices.Clone(args), "--replicaof", host, port)})
		if err != nil {
			t.Fatalf("testredis: sentinel setup: replica %d: %v", i+1, err)
		}
		s.nodes = append(s.nodes, replica)
	}
	for _, n := range s.nodes {
		s.clients[n.Addr()] = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	}

	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	host, port, _ := net.SplitHostPort(primary.Addr())
	text := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 1\n"+
		"sentinel down-after-milliseconds %[1]s %[4]d\n"+
		"sentinel failover-timeout %[1]s %[5]d\n",
		s.name, host, port, sentinelDownAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds())
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil { // Sentinel rewrites it, so it must be writable
		t.Fatalf("testredis: sentinel setup: %v", err)
	}
	sen, err := start(bin, dir, Config{sentinelConf: conf})
	if err != nil {
		t.Fatalf("testredis: sentinel setup: sentinel: %v", err)
	}
	s.sentinel = sen
	s.sc = redis.NewSentinelClient(&redis.Options{Addr: sen.Addr(), MaxRetries: -1})

	ctx, cancel := context.WithTimeout(context.Background(), sentinelBound)
	defer cancel()
	period := strconv.FormatInt(sentinelPeriod.Milliseconds(), 10)
	debug := redis.NewStatusCmd(ctx, "SENTINEL", "DEBUG",
		"info-period", strconv.FormatInt(sentinelInfoPeriod.Milliseconds(), 10),
		"ping-period", period, "publish-period", period,
		"tilt-trigger", strconv.FormatInt(sentinelTiltTrigger.Milliseconds(), 10))
	if err := s.sc.Process(ctx, debug); err != nil {
		// Redis before 7.0 has no SENTINEL DEBUG: failovers take longer.
		t.Logf("testredis: SENTINEL DEBUG: %v (failovers will take about 10 s each)", err)
	}
	if err := s.waitReplicas(ctx, primary.Addr()); err != nil {
		t.Fatalf("testredis: sentinel setup not ready within %v: %v\nsentinel log:\n%s", sentinelBound, err, sen.Log())
	}
	return s
}

// MasterName returns the name the Sentinel monitors the primary under, for
// redis.FailoverOptions.MasterName.
func (s *Sentinel) MasterName() string { return s.name }

// SentinelAddrs returns the Sentinels' host:port addresses, for
// redis.FailoverOptions.SentinelAddrs.
func (s *Sentinel) SentinelAddrs() []string { return []string{s.sentinel.Addr()} }

// SentinelServer returns the Sentinel process.
func (s *Sentinel) SentinelServer() *Server { return s.sentinel }

// Nodes returns the primary and the replicas; the first was the primary at
// start. Each is a Server that can be paused, stopped or read directly.
func (s *Sentinel) Nodes() []*Server { return slices.Clone(s.nodes) }

// Node returns the data node listening on addr, or nil if there is none.
func (s *Sentinel) Node(addr string) *Server {
	for _, n := range s.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Primary returns the address of the primary as the Sentinel reports it
// (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinel) Primary(ctx context.Context) (string, error) {
	hp, err := s.sc.GetMasterAddrByName(ctx, s.name).Result()
	if err != nil {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME %s: %w", s.name, err)
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME %s: got %q, want host and port", s.name, hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// NewFailoverClient returns a go-redis client that finds the primary
// through the Sentinel (redis.NewFailoverClient), closed at the end of the
// test. opts may be nil; its MasterName and SentinelAddrs are overwritten.
func (s *Sentinel) NewFailoverClient(t testing.TB, opts *redis.FailoverOptions) *redis.Client {
	t.Helper()
	var o redis.FailoverOptions
	if opts != nil {
		o = *opts
	}
	o.MasterName = s.name
	o.SentinelAddrs = s.SentinelAddrs()
	c := redis.NewFailoverClient(&o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Failover makes the Sentinel fail over (SENTINEL FAILOVER: a replica is
// promoted although the primary is up) and waits until it is done: the
// Sentinel names a new primary, that node reports the primary role, every
// other node (the old primary included) reports itself a replica of it
// with its link up and its first sync done, and the Sentinel no longer
// has a failover in progress. It returns the new primary's address. While
// the Sentinel has no replica it deems fit to promote (NOGOODSLAVE), as
// just after a previous failover, or has a failover in progress (INPROG),
// it retries. It gives up with an error after 30 s or when ctx ends.
//
// Writes the old primary acknowledged but had not replicated are lost, as
// in any Redis failover; those it accepts after the promotion too, until it
// is made a replica (a few hundred milliseconds later), unless its clients
// wait for a replica (WAIT), since it then has none.
func (s *Sentinel) Failover(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, sentinelBound)
	defer cancel()
	old, err := s.Primary(ctx)
	if err != nil {
		return "", fmt.Errorf("testredis: failover: %w", err)
	}
	aborts := 0
	for {
		if err := s.startFailover(ctx); err != nil {
			return "", fmt.Errorf("testredis: %w (after %d aborted failovers)\nsentinel log:\n%s", err, aborts, s.sentinel.Log())
		}
		for {
			last := s.failedOver(ctx, old)
			if last == nil {
				return s.Primary(ctx)
			}
			if s.aborted(ctx, old) {
				aborts++
				break // start it again
			}
			if err := sleepCtx(ctx, sentinelPoll); err != nil {
				return "", fmt.Errorf("testredis: failover of %s (primary was %s) not done: %w (%w; %d aborted before)\nsentinel log:\n%s",
					s.name, old, last, err, aborts, s.sentinel.Log())
			}
		}
	}
}

// startFailover sends SENTINEL FAILOVER, again while the Sentinel answers
// NOGOODSLAVE or INPROG.
func (s *Sentinel) startFailover(ctx context.Context) error {
	for {
		err := s.sc.Failover(ctx, s.name).Err()
		if err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), "NOGOODSLAVE") && !strings.Contains(err.Error(), "INPROG") {
			return fmt.Errorf("SENTINEL FAILOVER %s: %w", s.name, err)
		}
		if werr := sleepCtx(ctx, sentinelPoll); werr != nil {
			return fmt.Errorf("SENTINEL FAILOVER %s: still %w: %w", s.name, err, werr)
		}
	}
}

// aborted reports whether the Sentinel has given up the failover away from
// old: no failover is in progress, and it still names old. (The flags are
// read first: a failover that completes in between shows the new primary.)
func (s *Sentinel) aborted(ctx context.Context, old string) bool {
	m, err := s.sc.Master(ctx, s.name).Result()
	if err != nil || strings.Contains(m["flags"], "failover") {
		return false
	}
	cur, err := s.Primary(ctx)
	return err == nil && cur == old
}

// failedOver returns nil when the failover away from old is done, and
// otherwise says what is still missing.
func (s *Sentinel) failedOver(ctx context.Context, old string) error {
	cur, err := s.Primary(ctx)
	if err != nil {
		return err
	}
	if cur == old {
		return fmt.Errorf("the Sentinel still names %s", old)
	}
	if s.Node(cur) == nil {
		return fmt.Errorf("the Sentinel names %s, not one of the nodes", cur)
	}
	m, err := s.sc.Master(ctx, s.name).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL MASTER: %w", err)
	}
	if strings.Contains(m["flags"], "failover") {
		return fmt.Errorf("the Sentinel's flags of %s: %s", s.name, m["flags"])
	}
	return s.waitReplicasOnce(ctx, cur)
}

// waitReplicas waits until every node but primary is a replica of it
// whose first sync is done, and the Sentinel knows them all as healthy.
func (s *Sentinel) waitReplicas(ctx context.Context, primary string) error {
	for {
		err := s.waitReplicasOnce(ctx, primary)
		if err == nil {
			return nil
		}
		if werr := sleepCtx(ctx, sentinelPoll); werr != nil {
			return fmt.Errorf("%w (%w)", err, werr)
		}
	}
}

// waitReplicasOnce checks once what waitReplicas waits for.
func (s *Sentinel) waitReplicasOnce(ctx context.Context, primary string) error {
	role, err := s.role(ctx, primary)
	if err != nil {
		return err
	}
	if role[0] != "master" {
		return fmt.Errorf("%s reports role %v, want master", primary, role)
	}
	for _, n := range s.nodes {
		if n.Addr() == primary {
			continue
		}
		role, err := s.role(ctx, n.Addr())
		if err != nil {
			return err
		}
		// A replica's ROLE: slave, primary host, primary port, link state,
		// offset. Through a HoldableReplication proxy the primary's port is
		// the proxy's.
		if role[0] != "slave" || len(role) < 4 || role[3] != "connected" {
			return fmt.Errorf("%s reports role %v, want a connected replica", n.Addr(), role)
		}
		if target := net.JoinHostPort(role[1], role[2]); target != primary && !s.proxied(target, primary) {
			return fmt.Errorf("%s replicates %s, want %s", n.Addr(), target, primary)
		}
	}
	reps, err := s.sc.Replicas(ctx, s.name).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	healthy := 0
	for _, r := range reps {
		if r["flags"] == "slave" && r["master-link-status"] == "ok" && r["role-reported"] == "slave" {
			healthy++
		}
	}
	if want := len(s.nodes) - 1; healthy < want {
		return fmt.Errorf("the Sentinel knows %d healthy replicas, want %d: %v", healthy, want, reps)
	}
	return nil
}

// proxied reports whether target is the address of a replication proxy to
// primary.
func (s *Sentinel) proxied(target, primary string) bool {
	for _, p := range s.proxies {
		if p.addr() == target && p.target == primary {
			return true
		}
	}
	return false
}

// role returns the reply of ROLE on the node at addr, as strings.
func (s *Sentinel) role(ctx context.Context, addr string) ([]string, error) {
	c := s.clients[addr]
	if c == nil {
		return nil, fmt.Errorf("no node at %s", addr)
	}
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return nil, fmt.Errorf("ROLE on %s: %w", addr, err)
	}
	if len(v) == 0 {
		return nil, fmt.Errorf("ROLE on %s: empty reply", addr)
	}
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprint(x)
	}
	return out, nil
}

// WaitSynced waits until every replica has processed everything the primary
// had written when WaitSynced was called (its slave_repl_offset has reached
// the primary's master_repl_offset), so that a Failover then loses nothing.
// It gives up with an error after 30 s or when ctx ends.
func (s *Sentinel) WaitSynced(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sentinelBound)
	defer cancel()
	primary, err := s.Primary(ctx)
	if err != nil {
		return fmt.Errorf("testredis: WaitSynced: %w", err)
	}
	want, err := s.replOffset(ctx, primary, "master_repl_offset")
	if err != nil {
		return fmt.Errorf("testredis: WaitSynced: %w", err)
	}
	for _, n := range s.nodes {
		if n.Addr() == primary {
			continue
		}
		for {
			got, err := s.replOffset(ctx, n.Addr(), "slave_repl_offset")
			if err == nil && got >= want {
				break
			}
			if werr := sleepCtx(ctx, sentinelPoll); werr != nil {
				return fmt.Errorf("testredis: WaitSynced: replica %s at offset %d (%v), want %d: %w", n.Addr(), got, err, want, werr)
			}
		}
	}
	return nil
}

// replOffset returns the integer field of INFO replication on the node at
// addr.
func (s *Sentinel) replOffset(ctx context.Context, addr, field string) (int64, error) {
	info, err := s.clients[addr].Info(ctx, "replication").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO replication on %s: %w", addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO replication on %s: no %s", addr, field)
}

// HoldReplication stops the replication stream from the primary to every
// replica, for a setup started with HoldableReplication: nothing the
// primary sends after HoldReplication returns reaches a replica, while
// every process keeps running and answering (the replicas still report
// their link up, so the Sentinel still promotes one). Writes acknowledged
// from then on are what a failover loses. The hold lasts until the end of
// the test. It fails the test for a setup without HoldableReplication.
func (s *Sentinel) HoldReplication(t testing.TB) {
	t.Helper()
	if len(s.proxies) == 0 {
		t.Fatal("testredis: HoldReplication needs SentinelConfig.HoldableReplication")
	}
	for _, p := range s.proxies {
		p.hold()
	}
}

// Stop stops the Sentinel, then the replicas, then the primary, and waits
// for each to exit. It runs automatically at the end of the test and is
// idempotent.
func (s *Sentinel) Stop() {
	s.stopOnce.Do(func() {
		if s.sc != nil {
			_ = s.sc.Close()
		}
		if s.sentinel != nil {
			s.sentinel.Stop()
		}
		for _, c := range s.clients {
			_ = c.Close()
		}
		for i := len(s.nodes) - 1; i >= 0; i-- {
			s.nodes[i].Stop()
		}
		for _, p := range s.proxies {
			p.close()
		}
	})
}

// sleepCtx waits d, or until ctx ends (returning its error): polling a
// server's state, not synchronising goroutines.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// linkProxy forwards TCP connections to target, and can stop forwarding
// what target sends.
type linkProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // the accept loop and every pipe

	mu     sync.Mutex // guards held, closed, conns
	cond   sync.Cond  // on mu; broadcast when closed is set
	held   bool
	closed bool
	conns  map[net.Conn]struct{}
}

func newLinkProxy(target string) (*linkProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &linkProxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.cond.L = &p.mu
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *linkProxy) addr() string { return p.ln.Addr().String() }

func (p *linkProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(u, c, false) // replica to primary: never held
		go p.pipe(c, u, true)  // primary to replica
	}
}

// pipe copies src to dst until either fails; with holdable, nothing read
// once the link is held is written.
func (p *linkProxy) pipe(dst, src net.Conn, holdable bool) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if holdable && !p.pass() {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass waits while the link is held; it returns false once the proxy is
// closed.
func (p *linkProxy) pass() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.held && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}

func (p *linkProxy) hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// close stops the proxy, closes every connection and waits for every
// goroutine.
func (p *linkProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
