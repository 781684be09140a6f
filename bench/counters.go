package main

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// cmdCounter is a go-redis hook that counts the commands a client sends,
// each command of a pipeline counted once. Commands written on a pub/sub
// connection (SUBSCRIBE, its health-check PING) bypass hooks and are not
// counted; the idle measurement counts at the server instead.
type cmdCounter struct {
	n     atomic.Int64
	dials atomic.Int64 // connections dialled; each sends commands of its own (HELLO), counted in n
}

var _ redis.Hook = (*cmdCounter)(nil)

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.dials.Add(1)
		return next(ctx, network, addr)
	}
}

func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// newRedisClient returns a client of addr named name (CLIENT SETNAME, so the
// server can tell its connections apart), counting commands with hook when
// it is not nil.
func newRedisClient(addr, name string, hook *cmdCounter) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ClientName:            name,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	})
	if hook != nil {
		c.AddHook(hook)
	}
	return c
}

// rpcCounter counts the requests an etcd client sends: unary calls and
// messages sent on streams (each lease keep-alive and each watch request is
// one message), and the streams it opens. onKeepAlive, when set, is called
// after each lease keep-alive response the client receives.
type rpcCounter struct {
	unary   atomic.Int64
	sends   atomic.Int64
	streams atomic.Int64

	onKeepAlive atomic.Pointer[func()]
}

// requests returns the number of requests so far.
func (c *rpcCounter) requests() int64 { return c.unary.Load() + c.sends.Load() }

// configure adds the counting interceptors to cfg.
func (c *rpcCounter) configure(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions,
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.unary.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.streams.Add(1)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return s, err
			}
			return &countedStream{ClientStream: s, c: c, keepAlive: strings.HasSuffix(method, "/LeaseKeepAlive")}, nil
		}),
	)
}

type countedStream struct {
	grpc.ClientStream
	c         *rpcCounter
	keepAlive bool
}

func (s *countedStream) SendMsg(m any) error {
	s.c.sends.Add(1)
	return s.ClientStream.SendMsg(m)
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.keepAlive {
		if f := s.c.onKeepAlive.Load(); f != nil {
			(*f)()
		}
	}
	return err
}

// newEtcdClient returns a client of the embedded server counting its
// requests with c (when not nil).
func newEtcdClient(srv *etcdServer, c *rpcCounter) (*clientv3.Client, error) {
	cfg := srv.clientConfig()
	if c != nil {
		c.configure(&cfg)
	}
	return clientv3.New(cfg)
}

// cpuTime returns the CPU time (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPUTime returns the CPU time (user + system) process pid has used, read
// from /proc (clock-tick resolution, 10 ms on Linux).
func procCPUTime(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime field 14, stime field 15.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz
}

// monitor counts the commands redis-server executes per client name, with
// MONITOR on a raw connection, so that commands a client library sends
// around its hooks (pub/sub PING and SUBSCRIBE) are counted too.
type monitor struct {
	conn net.Conn
	done chan map[string]int64 // counts by client address
}

func startMonitor(addr string) (*monitor, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		c.Close()
		return nil, err
	}
	m := &monitor{conn: c, done: make(chan map[string]int64, 1)}
	ready := make(chan struct{})
	go m.read(ready)
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
	}
	return m, nil
}

func (m *monitor) read(ready chan struct{}) {
	counts := make(map[string]int64)
	buf := make([]byte, 0, 64<<10)
	tmp := make([]byte, 32<<10)
	first := true
	for {
		n, err := m.conn.Read(tmp)
		buf = append(buf, tmp[:n]...)
		for {
			i := strings.IndexByte(string(buf), '\n')
			if i < 0 {
				break
			}
			line := string(buf[:i])
			buf = buf[i+1:]
			if first { // "+OK"
				first = false
				close(ready)
				continue
			}
			// +1700000000.123456 [0 127.0.0.1:54321] "evalsha" ...
			a := strings.IndexByte(line, '[')
			b := strings.IndexByte(line, ']')
			if a < 0 || b < a {
				continue
			}
			f := strings.Fields(line[a+1 : b])
			if len(f) != 2 || f[1] == "lua" {
				continue // commands run by scripts are part of the script's request
			}
			counts[f[1]]++
		}
		if err != nil {
			m.done <- counts
			return
		}
	}
}

// stop ends the monitor and returns the counts per client address.
func (m *monitor) stop() map[string]int64 {
	m.conn.Close()
	return <-m.done
}

// clientNames returns the name of every connection of the server, by
// address.
func clientNames(ctx context.Context, admin *redis.Client) (map[string]string, error) {
	s, err := admin.ClientList(ctx).Result()
	if err != nil {
		return nil, err
	}
	names := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		var addr, name string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "addr="); ok {
				addr = v
			} else if v, ok := strings.CutPrefix(f, "name="); ok {
				name = v
			}
		}
		if addr != "" {
			names[addr] = name
		}
	}
	return names, nil
}
