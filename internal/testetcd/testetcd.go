// Package testetcd starts real etcd servers inside the test process, with
// go.etcd.io/etcd/server/v3/embed, on free 127.0.0.1 ports and temporary data
// directories.
//
// It exists for tests, benchmarks and checkers only. Import it from _test.go
// files (or other test-only programs), never from library code: it pulls in
// the whole etcd server, which library users must not have to compile.
//
// The servers are tuned for tests: a 10 ms heartbeat and a 100 ms election
// timeout (so the smallest lease TTL etcd grants is 1 s), no fsync, and no
// logging (set TESTETCD_LOG_LEVEL=error, info or debug to see the server's
// zap log on stderr).
package testetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/sovereign-go/sovereign/etcdbackend"
)

// Timing of the embedded servers.
const (
	// TickMs is the raft heartbeat interval of every member, in milliseconds.
	TickMs = 10
	// ElectionMs is the raft election timeout of every member, in
	// milliseconds.
	ElectionMs = 100
	// startTimeout bounds how long a member may take to become ready.
	startTimeout = 30 * time.Second
)

// Cluster is a running etcd cluster of one or more embedded members. Its
// methods are safe for concurrent use.
type Cluster struct {
	root    string // data directories live under root
	ownRoot bool   // root was created by New and is removed by Close
	token   string
	initial string // the initial-cluster flag value

	mu      sync.Mutex // guards members[i].etcd, closed and backups
	members []*member
	closed  bool
	backups int // files written by Backup
}

type member struct {
	name   string
	dir    string
	client url.URL
	peer   url.URL
	etcd   *embed.Etcd // nil while stopped
}

// Start starts a one-member cluster that is stopped, and whose data is
// removed, when the test ends. It fails the test if the server cannot start.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartCluster(t, 1)
}

// StartCluster starts an n-member cluster that is stopped, and whose data is
// removed, when the test ends. It fails the test if the cluster cannot start.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c, err := newCluster(t.TempDir(), false, n)
	if err != nil {
		t.Fatalf("testetcd: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// New starts an n-member cluster in a fresh temporary directory, for use where
// no testing.TB is at hand (TestMain, say). The caller must call Close, which
// also removes the directory.
func New(n int) (*Cluster, error) {
	root, err := os.MkdirTemp("", "testetcd-")
	if err != nil {
		return nil, fmt.Errorf("testetcd: %w", err)
	}
	c, err := newCluster(root, true, n)
	if err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("testetcd: %w", err)
	}
	return c, nil
}

func newCluster(root string, ownRoot bool, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("cluster size %d is not positive", n)
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{root: root, ownRoot: ownRoot, token: fmt.Sprintf("testetcd-%d-%d", os.Getpid(), time.Now().UnixNano())}
	var initial []string
	for i := range n {
		m := &member{
			name:   fmt.Sprintf("m%d", i),
			dir:    filepath.Join(root, fmt.Sprintf("m%d", i)),
			client: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])},
			peer:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])},
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peer.String())
	}
	c.initial = strings.Join(initial, ",")

	// Members of a multi-member cluster wait for each other, so start them
	// all before waiting for any.
	for _, m := range c.members {
		e, err := embed.StartEtcd(c.config(m))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("start member %s: %w", m.name, err)
		}
		m.etcd = e
	}
	for _, m := range c.members {
		if err := waitReady(m.etcd); err != nil {
			c.Close()
			return nil, fmt.Errorf("member %s: %w", m.name, err)
		}
	}
	return c, nil
}

func (c *Cluster) config(m *member) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.client}
	cfg.AdvertiseClientUrls = []url.URL{m.client}
	cfg.ListenPeerUrls = []url.URL{m.peer}
	cfg.AdvertisePeerUrls = []url.URL{m.peer}
	cfg.InitialCluster = c.initial
	cfg.InitialClusterToken = c.token
	cfg.TickMs = TickMs
	cfg.ElectionMs = ElectionMs
	cfg.UnsafeNoFsync = true
	cfg.Metrics = "basic"
	cfg.Logger = "zap"
	cfg.LogLevel = logLevel()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newLogger(cfg.LogLevel))
	return cfg
}

func logLevel() string {
	if l := os.Getenv("TESTETCD_LOG_LEVEL"); l != "" {
		return l
	}
	// Error level is still noisy: a member that is stopped logs errors
	// about its own closed listeners. Real start-up failures are returned
	// by StartEtcd and Err, so the default is silence.
	return "panic"
}

func newLogger(level string) *zap.Logger {
	cfg := logutil.DefaultZapLoggerConfig
	cfg.Level = zap.NewAtomicLevelAt(logutil.ConvertToZapLevel(level))
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	lg, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return lg
}

func waitReady(e *embed.Etcd) error {
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("failed while starting: %w", err)
	case <-time.After(startTimeout):
		return fmt.Errorf("not ready after %v", startTimeout)
	}
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. The ports are
// free when it returns; another process could take one before etcd binds it,
// which is unlikely enough for tests.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Size returns the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Endpoints returns the client URLs of all members, running or not.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.client.String()
	}
	return eps
}

// Endpoint returns the client URL of member i.
func (c *Cluster) Endpoint(i int) string { return c.members[i].client.String() }

// Stop stops member i; its data is kept for Restart. Stopping a stopped
// member does nothing.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	e := c.members[i].etcd
	c.members[i].etcd = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts member i again, on the same ports and data, and waits until
// it is ready (which for a cluster member means it has rejoined a quorum).
// Restarting a running member does nothing.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("testetcd: cluster closed")
	}
	m := c.members[i]
	if m.etcd != nil {
		return nil
	}
	e, err := embed.StartEtcd(c.config(m))
	if err != nil {
		return fmt.Errorf("testetcd: restart member %s: %w", m.name, err)
	}
	if err := waitReady(e); err != nil {
		e.Close()
		return fmt.Errorf("testetcd: restart member %s: %w", m.name, err)
	}
	m.etcd = e
	return nil
}

// RestartWithoutData stops member i of a one-member cluster, deletes its
// data, and starts it again on the same ports, empty: every key, lease and
// revision is gone, as after a restore of an empty data directory. It waits
// until the member is ready. Clients made before keep working once they have
// reconnected; revisions start again from 1.
func (c *Cluster) RestartWithoutData(i int) error {
	if len(c.members) != 1 {
		return fmt.Errorf("testetcd: RestartWithoutData needs a one-member cluster, this one has %d", len(c.members))
	}
	c.Stop(i)
	c.mu.Lock()
	dir := c.members[i].dir
	c.mu.Unlock()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("testetcd: delete the data of member %d: %w", i, err)
	}
	return c.Restart(i)
}

// Backup saves a snapshot of the cluster's data through member i, as
// `etcdctl snapshot save` does, to a new file under the cluster's data root,
// and returns the file's path.
func (c *Cluster) Backup(ctx context.Context, i int) (string, error) {
	c.mu.Lock()
	c.backups++
	file := filepath.Join(c.root, fmt.Sprintf("backup-%d.db", c.backups))
	c.mu.Unlock()
	if _, err := snapshot.NewV3(zap.NewNop()).Save(ctx, c.ClientConfig(c.Endpoint(i)), file); err != nil {
		return "", fmt.Errorf("testetcd: back up member %d: %w", i, err)
	}
	return file, nil
}

// RestoreBackup stops member i of a one-member cluster, replaces its data
// with a restore of backup (a file Backup wrote), as `etcdutl snapshot
// restore` does, and starts it again on the same ports, waiting until it is
// ready: every key, lease and revision written since the backup is gone,
// every key deleted since is back, and the leases of the backup are granted
// a full TTL again. With bump > 0 the restored revision is raised by bump
// and marked compacted (`--bump-revision bump --mark-compacted`, the
// procedure etcd's disaster-recovery guide gives so that revisions never go
// back: bump must exceed the revisions written since the backup); with 0,
// revisions go back to the backup's, as after rolling back a disk or VM
// snapshot. Clients made before keep working once they have reconnected.
func (c *Cluster) RestoreBackup(i int, backup string, bump uint64) error {
	if len(c.members) != 1 {
		return fmt.Errorf("testetcd: RestoreBackup needs a one-member cluster, this one has %d", len(c.members))
	}
	c.Stop(i)
	c.mu.Lock()
	m := c.members[i]
	c.mu.Unlock()
	if err := os.RemoveAll(m.dir); err != nil {
		return fmt.Errorf("testetcd: delete the data of member %d: %w", i, err)
	}
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        backup,
		Name:                m.name,
		OutputDataDir:       m.dir,
		PeerURLs:            []string{m.peer.String()},
		InitialCluster:      c.initial,
		InitialClusterToken: c.token,
		RevisionBump:        bump,
		MarkCompacted:       bump > 0,
	})
	if err != nil {
		return fmt.Errorf("testetcd: restore member %d from %s: %w", i, backup, err)
	}
	return c.Restart(i)
}

// Running reports whether member i is running.
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].etcd != nil
}

// LeaderIndex returns the index of the member that currently is the raft
// leader, as seen by the running members, or -1 if none is known.
func (c *Cluster) LeaderIndex() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.etcd == nil {
			continue
		}
		lead := uint64(m.etcd.Server.Leader())
		for j, o := range c.members {
			if o.etcd != nil && uint64(o.etcd.Server.MemberID()) == lead {
				return j
			}
		}
	}
	return -1
}

// Close stops every member and, for a cluster made by New, removes its data.
// It is idempotent.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	var leader *embed.Etcd
	var others []*embed.Etcd
	for _, m := range c.members {
		switch {
		case m.etcd == nil:
		case m.etcd.Server.Leader() == m.etcd.Server.MemberID():
			leader = m.etcd
		default:
			others = append(others, m.etcd)
		}
		m.etcd = nil
	}
	c.mu.Unlock()
	// A leader that stops first tries to hand its leadership over and waits
	// seconds for stopping followers; stopping the followers first (in
	// parallel, since each waits up to a second for its peer listeners)
	// leaves it nobody to hand over to.
	var wg sync.WaitGroup
	for _, e := range others {
		wg.Go(e.Close)
	}
	wg.Wait()
	if leader != nil {
		leader.Close()
	}
	if c.ownRoot {
		os.RemoveAll(c.root)
	}
}

// ClientConfig returns the configuration users are told to use,
// etcdbackend.ClientConfig, for the given endpoints (all members when none
// are given), with a silent logger and nothing else changed: tests that
// restart members see the reconnection behaviour users get. Tests add their
// own options (say, DialOptions with an interceptor) and call clientv3.New.
func (c *Cluster) ClientConfig(endpoints ...string) clientv3.Config {
	if len(endpoints) == 0 {
		endpoints = c.Endpoints()
	}
	cfg := etcdbackend.ClientConfig(endpoints...)
	cfg.Logger = zap.NewNop()
	return cfg
}

// Client returns a client of all members, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return NewClient(t, c.ClientConfig())
}

// NewClient creates a client from cfg that is closed when the test ends. It
// fails the test if the client cannot be created.
func NewClient(t testing.TB, cfg clientv3.Config) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("testetcd: new client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Compact compacts the key-value history of the cluster up to its current
// revision, physically, and returns that revision.
func (c *Cluster) Compact(ctx context.Context, cli *clientv3.Client) (int64, error) {
	resp, err := cli.Get(ctx, "testetcd-compact-probe")
	if err != nil {
		return 0, fmt.Errorf("testetcd: read revision: %w", err)
	}
	rev := resp.Header.Revision
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return 0, fmt.Errorf("testetcd: compact to %d: %w", rev, err)
	}
	return rev, nil
}

// IgnoredGoroutines returns goleak options for goroutines that the etcd
// server leaves behind after Close: the HTTP connections between members of a
// multi-member cluster (both ends live in the test process, and etcd's peer
// listeners close without closing connections already accepted). Library
// code of this module does not use net/http, so ignoring these goroutines
// hides none of its leaks. Use it as
// goleak.VerifyTestMain(m, testetcd.IgnoredGoroutines()...).
func IgnoredGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	}
}
