package etcdbackend_test

import (
	"context"
	"maps"
	"net"
	"net/url"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
)

// counter counts the gRPC requests a client makes: unary calls, streams
// opened (a watch is a stream), and each keep-alive sent on a lease
// keep-alive stream (the stream itself is not counted, unless it could not
// be opened: clientv3's KeepAliveOnce opens one per keep-alive, a Backend
// keeps one open).
type counter struct {
	unary     atomic.Int64
	streams   atomic.Int64
	kaStreams atomic.Int64 // lease keep-alive streams opened (not in total)

	mu      sync.Mutex       // guards methods
	methods map[string]int64 // requests by gRPC method
}

// count records a request of method.
func (c *counter) count(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.methods == nil {
		c.methods = make(map[string]int64)
	}
	c.methods[path.Base(method)]++
}

// reset sets every count to zero.
func (c *counter) reset() {
	c.unary.Store(0)
	c.streams.Store(0)
	c.kaStreams.Store(0)
	c.mu.Lock()
	c.methods = nil
	c.mu.Unlock()
}

// byMethod returns the requests by method since the last reset.
func (c *counter) byMethod() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.methods)
}

// total returns the number of requests so far.
func (c *counter) total() int64 { return c.unary.Load() + c.streams.Load() }

// configure adds the counting interceptors to cfg.
func (c *counter) configure(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions,
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.unary.Add(1)
			c.count(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if path.Base(method) == "LeaseKeepAlive" {
				c.kaStreams.Add(1)
				s, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil {
					// A keep-alive that failed before it could be sent.
					c.streams.Add(1)
					c.count(method)
					return s, err
				}
				return &countedSends{ClientStream: s, c: c, method: method}, nil
			}
			c.streams.Add(1)
			c.count(method)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	)
}

// countedSends counts each message sent on a stream as a request.
type countedSends struct {
	grpc.ClientStream
	c      *counter
	method string
}

func (s *countedSends) SendMsg(m any) error {
	s.c.streams.Add(1)
	s.c.count(s.method)
	return s.ClientStream.SendMsg(m)
}

// proxy is a TCP proxy on 127.0.0.1 whose connections a test can cut, to
// break a client's connection to etcd without stopping the server.
type proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex // guards conns, cut, gen and stalled
	conns   map[net.Conn]struct{}
	cut     bool
	gen     int // number of connections accepted so far
	stalled int // connections numbered below this drop every byte

	wg sync.WaitGroup
}

// startProxy starts a proxy to the host of endpoint (a URL), closed when the
// test ends.
func startProxy(t testing.TB, endpoint string) *proxy {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatalf("parse endpoint: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, target: u.Host, conns: make(map[net.Conn]struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// endpoint returns the proxy's URL.
func (p *proxy) endpoint() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.conns[up] = struct{}{}
		gen := p.gen
		p.gen++
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				p.mu.Lock()
				stalled := gen < p.stalled
				p.mu.Unlock()
				if n > 0 && !stalled {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { pipe(c, up) })
	}
}

// setCut closes every connection and refuses new ones (cut) or accepts them
// again.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

// stall makes every connection open now drop all its bytes from now on,
// without closing it, as a crashed host or a network partition does; later
// connections work.
func (p *proxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = p.gen
}

func (p *proxy) close() {
	p.ln.Close()
	p.setCut(true)
	p.wg.Wait()
}

// nextEvent waits up to bound for an event on ch and fails the test if none
// comes or the channel closes.
func nextEvent(t testing.TB, ch <-chan backend.Event, what string, bound time.Duration) backend.Event {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatalf("%s: watch channel closed, want an event", what)
		}
		return e
	case <-timer.C:
		t.Fatalf("%s: no event within %v", what, bound)
		return backend.Event{}
	}
}
