package chaos

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// Mode is what a Proxy does with the traffic it carries.
type Mode int

const (
	// Pass forwards everything at once.
	Pass Mode = iota
	// Drop is a black hole: connections are accepted and stay open, but no
	// byte is forwarded in either direction until the proxy heals; then
	// what was held back is delivered, as TCP would after a partition.
	Drop
	// Cut closes every connection and closes new ones as soon as they are
	// accepted, until the proxy heals.
	Cut
	// Latency delivers every chunk of bytes the given delay after it was
	// read, in order, in both directions.
	Latency
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Drop:
		return "drop"
	case Cut:
		return "cut"
	case Latency:
		return "latency"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

// Proxy is a TCP proxy on 127.0.0.1 in front of one target address, whose
// faults the test switches at run time. Create it with NewProxy; its methods
// are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex // guards mode, delay, changed, links, closed
	mode    Mode
	delay   time.Duration
	changed chan struct{} // closed and replaced on every change of mode
	links   map[*link]struct{}
	closed  bool

	wg sync.WaitGroup // the accept loop and every link's goroutines
}

// NewProxy listens on a free port of 127.0.0.1 and forwards connections to
// target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, changed: make(chan struct{}), links: make(map[*link]struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set switches the proxy to mode; delay is used by Latency only. Switching
// to Cut closes every open connection.
func (p *Proxy) Set(mode Mode, delay time.Duration) {
	p.mu.Lock()
	p.mode, p.delay = mode, delay
	close(p.changed)
	p.changed = make(chan struct{})
	var cut []*link
	if mode == Cut {
		for l := range p.links {
			cut = append(cut, l)
		}
	}
	p.mu.Unlock()
	for _, l := range cut {
		l.close()
	}
}

// Heal switches the proxy back to Pass.
func (p *Proxy) Heal() { p.Set(Pass, 0) }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Close stops listening, closes every connection and waits for every
// goroutine of the proxy to end. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) state() (Mode, time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode, p.delay, p.changed
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.closed || p.mode == Cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		l := &link{p: p, client: c, done: make(chan struct{})}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// link is one proxied connection.
type link struct {
	p      *Proxy
	client net.Conn
	server net.Conn // set by run before the pipes start

	once sync.Once
	done chan struct{} // closed by close
}

// close closes the link's connections, once. Its callers do not hold
// p.mu; it takes it to close done and read server, which run sets under it
// after checking done: either run sees done closed and closes its server
// itself, or close sees the server run set.
func (l *link) close() {
	l.once.Do(func() {
		l.p.mu.Lock()
		close(l.done)
		server := l.server
		l.p.mu.Unlock()
		l.client.Close()
		if server != nil {
			server.Close()
		}
	})
}

func (l *link) run() {
	defer l.p.wg.Done()
	defer func() {
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
		l.close()
	}()
	server, err := net.DialTimeout("tcp", l.p.target, 5*time.Second)
	if err != nil {
		return
	}
	l.p.mu.Lock()
	select {
	case <-l.done: // cut or closed while dialling
		l.p.mu.Unlock()
		server.Close()
		return
	default:
	}
	l.server = server
	l.p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { l.pipe(l.client, server) })
	wg.Go(func() { l.pipe(server, l.client) })
	wg.Wait()
}

// chunk is a piece of the byte stream and when it was read.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst, one chunk at a time, obeying the proxy's mode at
// the moment each chunk is due. When src ends, the chunks read so far are
// still delivered before dst's write side is closed.
func (l *link) pipe(src, dst net.Conn) {
	ch := make(chan chunk, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case ch <- chunk{buf[:n], time.Now()}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	defer wg.Wait()
	for c := range ch {
		if !l.deliver(dst, c) {
			l.close()
			for range ch { // let the reader end
			}
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		l.close()
	}
}

// deliver writes c to dst once the mode allows it, and reports whether the
// link is still usable.
func (l *link) deliver(dst net.Conn, c chunk) bool {
	for {
		mode, delay, changed := l.p.state()
		switch mode {
		case Pass:
			_, err := dst.Write(c.b)
			return err == nil
		case Cut:
			return false
		case Latency:
			due := time.Until(c.at.Add(delay))
			if due <= 0 {
				_, err := dst.Write(c.b)
				return err == nil
			}
			t := time.NewTimer(due)
			select {
			case <-t.C: // due now, unless the mode changed meanwhile
			case <-changed:
				t.Stop()
			case <-l.done:
				t.Stop()
				return false
			}
		case Drop:
			select {
			case <-changed:
			case <-l.done:
				return false
			}
		}
	}
}
