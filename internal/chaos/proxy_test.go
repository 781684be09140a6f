package chaos_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/internal/chaos"
)

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func newProxy(t *testing.T, target string) *chaos.Proxy {
	t.Helper()
	p, err := chaos.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends a line and reads the echo within timeout.
func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if len(line) > 0 {
		line = line[:len(line)-1]
	}
	return line, err
}

func TestProxyPass(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	for _, msg := range []string{"one", "two", "three"} {
		got, err := roundTrip(c, r, msg, 5*time.Second)
		if err != nil || got != msg {
			t.Fatalf("round trip %q: got %q, %v, want %q, nil", msg, got, err, msg)
		}
	}
}

// TestProxyDrop: nothing passes while dropping, and what was held back
// arrives, in order, after the heal, on the same connection.
func TestProxyDrop(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	if got, err := roundTrip(c, r, "before", 5*time.Second); err != nil || got != "before" {
		t.Fatalf("before drop: got %q, %v, want %q, nil", got, err, "before")
	}
	p.Set(chaos.Drop, 0)
	// The absence of an answer can only be observed for a while.
	_, err := roundTrip(c, r, "held", 300*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("while dropping: got error %v, want a timeout", err)
	}
	c2, r2 := dial(t, p.Addr()) // new connections are accepted, but stall too
	if _, err := roundTrip(c2, r2, "new", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection while dropping: got error %v, want a timeout", err)
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || line != "held\n" {
		t.Fatalf("after heal: got %q, %v, want the held line", line, err)
	}
	if got, err := roundTrip(c, r, "after", 5*time.Second); err != nil || got != "after" {
		t.Fatalf("after heal: got %q, %v, want %q, nil", got, err, "after")
	}
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := r2.ReadString('\n'); err != nil || line != "new\n" {
		t.Fatalf("new connection after heal: got %q, %v, want the held line", line, err)
	}
}

// TestProxyCut: open connections are closed, new ones are closed at once,
// and after the heal new connections work.
func TestProxyCut(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(c, r, "x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Set(chaos.Cut, 0)
	if _, err := roundTrip(c, r, "y", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("open connection after cut: got error %v, want it closed", err)
	}
	c2, r2 := dial(t, p.Addr())
	if _, err := roundTrip(c2, r2, "z", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection while cut: got error %v, want it closed", err)
	}
	p.Heal()
	c3, r3 := dial(t, p.Addr())
	if got, err := roundTrip(c3, r3, "ok", 5*time.Second); err != nil || got != "ok" {
		t.Fatalf("after heal: got %q, %v, want %q, nil", got, err, "ok")
	}
}

// TestProxyLatency: each direction adds the delay.
func TestProxyLatency(t *testing.T) {
	const delay = 150 * time.Millisecond
	p := newProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	p.Set(chaos.Latency, delay)
	start := time.Now()
	got, err := roundTrip(c, r, "slow", 10*time.Second)
	if err != nil || got != "slow" {
		t.Fatalf("got %q, %v, want %q, nil", got, err, "slow")
	}
	if rtt := time.Since(start); rtt < 2*delay {
		t.Fatalf("round trip took %v, want at least %v", rtt, 2*delay)
	}
	p.Heal()
	if got, err := roundTrip(c, r, "fast", 5*time.Second); err != nil || got != "fast" {
		t.Fatalf("after heal: got %q, %v, want %q, nil", got, err, "fast")
	}
}

// TestProxyClose: Close ends every connection and goroutine (goleak checks
// the latter in TestMain).
func TestProxyClose(t *testing.T) {
	p, err := chaos.NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c, r := dial(t, p.Addr())
	p.Set(chaos.Drop, 0)
	_, _ = io.WriteString(c, "stuck\n")
	if err := p.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Close: got %v, want the connection closed", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: got %v, want nil", err)
	}
}
