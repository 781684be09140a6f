package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/internal/testetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// redisServer is a redis-server process started by the benchmark on a free
// loopback port with its working directory in a temporary directory.
type redisServer struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedis starts bin (a redis-server binary) without persistence.
func startRedis(bin string) (*redisServer, error) {
	dir, err := os.MkdirTemp("", "sovereign-bench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 { // a probed free port can be taken before redis binds it
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
		if lastErr = s.launch(bin, port); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("start %s: %w", bin, lastErr)
}

func (s *redisServer) launch(bin string, port int) error {
	s.cmd = exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", s.dir,
		"--daemonize", "no", "--save", "", "--appendonly", "no", "--logfile", "",
		"--loglevel", "warning")
	// Pdeathsig: the server dies with the benchmark, even when it is killed.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	s.cmd.Stdout, s.cmd.Stderr = &out, &out
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("redis-server exited: %s", out.String())
		default:
		}
		if pingRedis(s.addr) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return errors.New("redis-server did not answer PING within 15s")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's readiness
	}
}

// pid returns the server's process ID.
func (s *redisServer) pid() int { return s.cmd.Process.Pid }

// stop terminates the server and removes its directory.
func (s *redisServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	os.RemoveAll(s.dir)
}

func pingRedis(addr string) error {
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// etcdServer is a one-member etcd cluster embedded in this process.
type etcdServer struct {
	c *testetcd.Cluster
}

func startEtcd() (*etcdServer, error) {
	c, err := testetcd.New(1)
	if err != nil {
		return nil, err
	}
	return &etcdServer{c: c}, nil
}

func (s *etcdServer) endpoint() string { return s.c.Endpoints()[0] }

func (s *etcdServer) stop() { s.c.Close() }

// clientConfig returns a client configuration with a silent logger.
func (s *etcdServer) clientConfig() clientv3.Config { return s.c.ClientConfig() }

// version asks the server for its version.
func (s *etcdServer) version() string {
	cli, err := clientv3.New(s.clientConfig())
	if err != nil {
		return "?"
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, s.endpoint())
	if err != nil {
		return "?"
	}
	return st.Version
}
