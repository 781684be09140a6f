// Package testredis starts a real redis-server for tests.
//
// Start launches /usr/bin/redis-server (or the first redis-server on PATH) on
// a free 127.0.0.1 port with its working directory in t.TempDir(), without
// persistence unless asked, and stops it when the test ends. When the
// environment variable REDIS_ADDR is set, Start uses that server instead and
// starts nothing (REDIS_CLUSTER_ADDR likewise for Config.Cluster); Restart and Kill then skip the test, since an external
// server cannot be restarted.
//
// StartSentinel starts a Sentinel setup (a primary, replicas and a Sentinel)
// and Sentinel.Failover runs a real failover.
//
// When redis-server cannot be found, Start skips the test with a loud reason,
// unless the environment variable SOVEREIGN_REQUIRE_REDIS is set (CI sets it),
// in which case the test fails.
//
// This package may be imported only from tests, benchmarks and fault checkers.
package testredis

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long Start waits for a freshly started server to
// answer PING.
const startTimeout = 15 * time.Second

// Config tunes the server Start launches. The zero value is what Start uses.
type Config struct {
	// Persistent turns on the append-only file with fsync on every write, so
	// that Restart keeps the data (term counters, leases and their absolute
	// expiry times). default: false (--save "" --appendonly no).
	Persistent bool
	// Cluster starts the server in cluster mode as a one-node cluster that
	// serves all 16384 slots, for *redis.ClusterClient tests. default: false
	Cluster bool
	// Args are extra redis-server arguments, e.g. "--notify-keyspace-events", "Kx".
	Args []string
	// SteppableClock starts the server with a shim that lets the test step
	// its wall clock (Server.StepClock), as an NTP step would. It needs a C
	// compiler (cc) to build the shim; without one the test is skipped
	// loudly (failed when SOVEREIGN_REQUIRE_REDIS is set). default: false
	SteppableClock bool

	// sentinelConf is the path of a Sentinel configuration file: when set,
	// the process runs as a Sentinel (redis-server <file> --sentinel) and
	// Persistent, Cluster and Args are ignored. StartSentinel sets it.
	sentinelConf string
}

// Server is a running redis-server (or an external one named by REDIS_ADDR).
// Its methods are safe for concurrent use.
type Server struct {
	addr     string
	external bool
	bin      string
	dir      string
	cfg      Config

	log *lockedWriter // the server's log output, across restarts

	mu   sync.Mutex    // guards cmd, done
	cmd  *exec.Cmd     // the running process, nil when stopped
	done chan struct{} // closed when cmd has exited
}

// Start starts a redis-server for the test and stops it at the end of the
// test. See the package doc for REDIS_ADDR and for when it skips.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartConfig(t, Config{})
}

// StartConfig is Start with a Config. With REDIS_ADDR set, cfg is ignored.
func StartConfig(t testing.TB, cfg Config) *Server {
	t.Helper()
	switch {
	case cfg.SteppableClock:
		// An external server's clock cannot be stepped: start one.
	case cfg.Cluster:
		if addr := os.Getenv("REDIS_CLUSTER_ADDR"); addr != "" {
			return &Server{addr: addr, external: true}
		}
	default:
		if addr := os.Getenv("REDIS_ADDR"); addr != "" {
			return &Server{addr: addr, external: true}
		}
	}
	bin := findServerOrSkip(t, "or set REDIS_ADDR")
	if cfg.SteppableClock {
		if _, err := clockShimPath(); err != nil {
			skipLoudly(t, fmt.Sprintf("testredis: SKIPPING test %s, which steps the server's clock: %v", t.Name(), err))
		}
	}
	s, err := start(bin, t.TempDir(), cfg)
	if err != nil {
		t.Fatalf("testredis: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// findServerOrSkip returns the path of redis-server, or skips t loudly when
// there is none (fails it when SOVEREIGN_REQUIRE_REDIS is set). alternative
// ends the advice of the message ("or set REDIS_ADDR").
func findServerOrSkip(t testing.TB, alternative string) string {
	t.Helper()
	bin, err := findServer()
	if err == nil {
		return bin
	}
	msg := fmt.Sprintf("testredis: SKIPPING real-Redis test %s: redis-server not found (%v); "+
		"install it (apt-get install -y redis-server)", t.Name(), err)
	if alternative != "" {
		msg += " " + alternative
	}
	skipLoudly(t, msg)
	return ""
}

// skipLoudly skips t with msg, also printed on stderr, or fails it when the
// environment variable SOVEREIGN_REQUIRE_REDIS is set (CI sets it).
func skipLoudly(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("SOVEREIGN_REQUIRE_REDIS") != "" {
		t.Fatal(msg + " (SOVEREIGN_REQUIRE_REDIS is set, so this is a failure)")
	}
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
}

// Launch starts redis-server binary bin (FindServer finds one) on a free
// loopback port, in a new temporary directory, outside any test: for tools
// such as the benchmark command. Close stops it and removes the directory.
func Launch(bin string, cfg Config) (*Server, error) {
	dir, err := os.MkdirTemp("", "sovereign-redis-")
	if err != nil {
		return nil, err
	}
	s, err := start(bin, dir, cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Close stops a server started by Launch and removes its directory.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// PID returns the server process's ID, or 0 when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// start launches bin with its data in dir on a free port.
func start(bin, dir string, cfg Config) (*Server, error) {
	s := &Server{bin: bin, dir: dir, cfg: cfg, log: &lockedWriter{w: new(bytes.Buffer)}}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind; retry
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("no free port: %w", err)
		}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("cannot start %s: %w", bin, lastErr)
}

// FindServer returns the path of a redis-server binary: on PATH or in the
// usual directories.
func FindServer() (string, error) { return findServer() }

func findServer() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("not on PATH nor in /usr/bin, /usr/sbin, /usr/local/bin")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launch starts the process on s.addr and waits until it answers PING.
func (s *Server) launch() error {
	_, port, _ := net.SplitHostPort(s.addr)
	args := []string{
		"--bind", "127.0.0.1",
		"--port", port,
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "",
	}
	switch {
	case s.cfg.sentinelConf != "":
		// The file comes first; Sentinel rewrites it (CONFIG REWRITE).
		args = append([]string{s.cfg.sentinelConf, "--sentinel"}, args...)
	default:
		args = append(args, "--databases", "16")
		if s.cfg.Persistent {
			args = append(args, "--save", "", "--appendonly", "yes", "--appendfsync", "always")
		} else {
			args = append(args, "--save", "", "--appendonly", "no")
		}
		if s.cfg.Cluster {
			args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+port+".conf")
		}
		args = append(args, s.cfg.Args...)
	}
	cmd := exec.Command(s.bin, args...)
	if s.cfg.SteppableClock {
		env, err := s.clockEnv()
		if err != nil {
			return err
		}
		cmd.Env = env
	}
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	// Pdeathsig: the server dies with the process that started it, even when
	// that process is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server exited at start: %s", s.Log())
		default:
		}
		if ping(s.addr) == nil {
			if s.cfg.Cluster {
				return s.assignSlots(deadline)
			}
			return nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redis-server on %s did not answer PING within %v: %s", s.addr, startTimeout, s.Log())
		}
		time.Sleep(10 * time.Millisecond) // polling the server's readiness, not synchronising goroutines
	}
}

// assignSlots makes a fresh cluster node serve every slot and waits until
// it reports cluster_state:ok. A restarted node keeps its slots.
func (s *Server) assignSlots(deadline time.Time) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER INFO: %w", err)
	}
	if !strings.Contains(info, "cluster_slots_assigned:16384") {
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE: %w", err)
		}
	}
	for {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster state not ok within %v: %v %q", startTimeout, err, info)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's cluster state
	}
}

// NewClusterClient returns a cluster client for a server started with
// Config.Cluster, closed at the end of the test. opts may be nil; its Addrs
// are overwritten.
func (s *Server) NewClusterClient(t testing.TB, opts *redis.ClusterOptions) *redis.ClusterClient {
	t.Helper()
	var o redis.ClusterOptions
	if opts != nil {
		o = *opts
	}
	o.Addrs = []string{s.addr}
	c := redis.NewClusterClient(&o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ping sends PING over a raw connection and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// NewClient returns a go-redis client for the server that is closed at the
// end of the test. opts may be nil; its Addr is overwritten.
func (s *Server) NewClient(t testing.TB, opts *redis.Options) *redis.Client {
	t.Helper()
	var o redis.Options
	if opts != nil {
		o = *opts
	}
	o.Addr = s.addr
	c := redis.NewClient(&o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// External reports whether the server came from REDIS_ADDR.
func (s *Server) External() bool { return s.external }

// Log returns what the server has logged so far (empty for an external server).
func (s *Server) Log() string {
	if s.log == nil {
		return ""
	}
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return s.log.w.String()
}

// Stop terminates the server (SIGTERM, then SIGKILL after 5 s) and waits for
// it to exit. It is a no-op for an external server or a stopped one, and it
// runs automatically at the end of the test.
func (s *Server) Stop() { s.stop(syscall.SIGTERM) }

// Kill ends the server abruptly with SIGKILL, like a crash, and waits for it
// to exit. With Config.Persistent, writes acknowledged before the kill survive
// a later Restart.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	if s.external {
		t.Skip("testredis: cannot kill an external server (REDIS_ADDR is set)")
	}
	s.stop(syscall.SIGKILL)
}

func (s *Server) stop(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot handle SIGTERM
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Pause freezes the server with SIGSTOP: connections stay open but nothing
// is answered, like a hung server or a network partition. Resume undoes it;
// so does Stop at the end of the test. It skips the test for an external
// server.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGSTOP)
}

// Resume continues a server frozen by Pause.
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGCONT)
}

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if s.external {
		t.Skip("testredis: cannot signal an external server (REDIS_ADDR is set)")
	}
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		t.Fatalf("testredis: %v to a stopped server", sig)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("testredis: %v: %v", sig, err)
	}
}

// Restart stops the server and starts it again on the same address and
// directory, so clients reconnect to the same host:port. Without
// Config.Persistent the data is gone afterwards. It skips the test for an
// external server.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if s.external {
		t.Skip("testredis: cannot restart an external server (REDIS_ADDR is set)")
	}
	s.Stop()
	s.Start(t)
}

// Start starts a stopped (or killed) server again on the same address and
// directory. It skips the test for an external server.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if s.external {
		t.Skip("testredis: cannot start an external server (REDIS_ADDR is set)")
	}
	var err error
	for range 50 { // the old socket may linger briefly
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond) // waiting for the port to be released by the OS
	}
	t.Fatalf("testredis: restart on %s: %v", s.addr, err)
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
