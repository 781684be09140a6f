package main

import (
	"io"
	"net"
	"sync"
	"testing"
)

// proxy is a TCP proxy in front of a server. Partition black-holes it: bytes
// already sent or sent later are held back (calls hang, nothing fails
// fast), like a network partition.
type proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex // guards blocked, conns
	cond    *sync.Cond // signalled when blocked changes
	blocked bool
	conns   []net.Conn

	wg sync.WaitGroup
}

// newProxy starts a proxy to upstream, closed at the end of the test.
func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: upstream}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's address.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Partition holds back every byte from now on, in both directions.
func (p *proxy) Partition() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(u, c) })
		p.wg.Go(func() { p.pipe(c, u) })
	}
}

// pipe copies from src to dst, holding each chunk while partitioned.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.blocked {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.blocked = false
	p.cond.Broadcast()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
