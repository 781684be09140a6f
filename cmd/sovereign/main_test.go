package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// bin is the sovereign binary built by TestMain.
var bin string

// wait bounds every wait for an event in these tests: generous, so that a
// loaded machine never fails a test that is correct.
const wait = 30 * time.Second

func TestMain(m *testing.M) {
	if mode := os.Getenv("SOVEREIGN_TEST_HELPER"); mode != "" {
		os.Exit(helperMain(mode))
	}
	dir, err := os.MkdirTemp("", "sovereign-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "sovereign")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building sovereign:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(testetcd.IgnoredGoroutines()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// helperMain is the child command the tests run under sovereign: the test
// binary itself, re-executed with SOVEREIGN_TEST_HELPER set. It connects to
// the test's unix socket SOVEREIGN_TEST_SOCK, reports its start (with the
// SOVEREIGN_* environment it got) and every signal it receives, and the
// kernel closes the connection when it dies, which is how the test learns
// the exact moment. Modes:
//
//	hold             run until SIGTERM, then exit 42
//	until-told       report signals, exit only when the test writes "exit N"
//	ignore-term      ignore SIGTERM (so only SIGKILL ends it) and spawn a
//	                 grandchild "sleep" in its process group, reporting its pid
//	spawn-exit       spawn that grandchild, report its pid, and exit 5 at once,
//	                 leaving it behind
func helperMain(mode string) int {
	conn, err := net.Dial("unix", os.Getenv("SOVEREIGN_TEST_SOCK"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SOVEREIGN_") && !strings.HasPrefix(kv, "SOVEREIGN_TEST_") && !strings.HasPrefix(kv, "SOVEREIGN_REQUIRE_") {
			env = append(env, kv)
		}
	}
	sort.Strings(env)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	fmt.Fprintf(conn, "start pid=%d pgid=%d %s\n", os.Getpid(), syscall.Getpgrp(), strings.Join(env, " "))
	if mode == "ignore-term" || mode == "spawn-exit" {
		gc := exec.Command("sleep", "1000")
		if err := gc.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 2
		}
		fmt.Fprintf(conn, "grandchild pid=%d\n", gc.Process.Pid)
		if mode == "spawn-exit" {
			return 5
		}
	}
	fmt.Fprintf(conn, "ready\n")
	if mode == "until-told" {
		// Exit with the status the test writes ("exit N").
		go func() {
			sc := bufio.NewScanner(conn)
			for sc.Scan() {
				if n, ok := strings.CutPrefix(sc.Text(), "exit "); ok {
					code, _ := strconv.Atoi(n)
					os.Exit(code)
				}
			}
		}()
	}
	for sig := range sigs {
		fmt.Fprintf(conn, "signal %s\n", sig)
		if sig == syscall.SIGTERM && mode == "hold" {
			return 42
		}
	}
	return 0
}

// childLine is a line a helper child sent, or its end (EOF set).
type childLine struct {
	conn int // which connection: 0 for the first child to connect, ...
	text string
	eof  bool
	at   time.Time
}

// children listens for helper children on a unix socket.
type children struct {
	t     *testing.T
	sock  string
	lines chan childLine

	mu    sync.Mutex // guards conns
	conns []net.Conn // by connection number
}

// tell writes a line to child conn.
func (c *children) tell(conn int, line string) {
	c.t.Helper()
	c.mu.Lock()
	cn := c.conns[conn]
	c.mu.Unlock()
	if _, err := fmt.Fprintf(cn, "%s\n", line); err != nil {
		c.t.Fatalf("tell child %d: %v", conn, err)
	}
}

func newChildren(t *testing.T) *children {
	t.Helper()
	dir, err := os.MkdirTemp("", "sov")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := &children{t: t, sock: sock, lines: make(chan childLine, 1024)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := 0; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.conns = append(c.conns, conn)
			c.mu.Unlock()
			wg.Go(func() {
				sc := bufio.NewScanner(conn)
				for sc.Scan() {
					c.lines <- childLine{conn: n, text: sc.Text(), at: time.Now()}
				}
				c.lines <- childLine{conn: n, eof: true, at: time.Now()}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		c.mu.Lock()
		for _, conn := range c.conns {
			conn.Close()
		}
		c.mu.Unlock()
		wg.Wait()
	})
	return c
}

// env returns the environment that makes a command run as a helper in mode.
func (c *children) env(mode string) []string {
	return []string{"SOVEREIGN_TEST_HELPER=" + mode, "SOVEREIGN_TEST_SOCK=" + c.sock}
}

// next returns the next line from any child, failing the test after wait.
func (c *children) next(what string) childLine {
	c.t.Helper()
	select {
	case l := <-c.lines:
		return l
	case <-time.After(wait):
		c.t.Fatalf("timed out after %v waiting for %s", wait, what)
		return childLine{}
	}
}

// expect returns the next line, which must begin with prefix and come from
// connection conn.
func (c *children) expect(conn int, prefix string) childLine {
	c.t.Helper()
	l := c.next(fmt.Sprintf("child %d: %q", conn, prefix))
	if l.conn != conn || l.eof || !strings.HasPrefix(l.text, prefix) {
		c.t.Fatalf("got child line %+v, want child %d line beginning %q", l, conn, prefix)
	}
	return l
}

// field returns the value of name=value in a helper's line.
func field(line, name string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}

// proc is a running sovereign binary.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout *bytes.Buffer
	mu     sync.Mutex // guards stderrLines
	stderr []string
	lines  chan string // stderr lines as they come
	out    chan string // stdout lines as they come
	done   chan struct{}
	code   int
}

// start runs the binary with args and extra environment, failing the test
// if it cannot start; the process is killed at the end of the test.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{t: t, cmd: cmd, stdout: &bytes.Buffer{}, lines: make(chan string, 4096), out: make(chan string, 4096), done: make(chan struct{})}
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	po, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readDone sync.WaitGroup
	readDone.Go(func() {
		sc := bufio.NewScanner(po)
		for sc.Scan() {
			p.mu.Lock()
			p.stdout.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.out <- sc.Text():
			default:
			}
		}
	})
	readDone.Go(func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr = append(p.stderr, sc.Text())
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
	})
	go func() {
		readDone.Wait()
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("sovereign %s stderr:\n%s", strings.Join(args, " "), p.stderrText())
		}
	})
	return p
}

// run runs the binary to completion and returns its exit code, stdout and
// stderr.
func run(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	p := start(t, env, args...)
	code := p.wait()
	return code, p.stdoutText(), p.stderrText()
}

func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(wait):
		p.t.Fatalf("sovereign did not exit within %v; stderr:\n%s", wait, p.stderrText())
		return -1
	}
}

// waitLog waits for a stderr line containing s.
func (p *proc) waitLog(s string) string {
	p.t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, s) {
				return l
			}
		case <-p.done:
			// Every line was queued before done closed.
			for {
				select {
				case l := <-p.lines:
					if strings.Contains(l, s) {
						return l
					}
					continue
				default:
				}
				break
			}
			p.t.Fatalf("sovereign exited (%d) before logging %q; stderr:\n%s", p.code, s, p.stderrText())
		case <-timeout:
			p.t.Fatalf("sovereign did not log %q within %v; stderr:\n%s", s, wait, p.stderrText())
		}
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

func (p *proc) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.stderr, "\n")
}

func (p *proc) stdoutText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String()
}

// nextOut returns the next line sovereign printed on stdout.
func (p *proc) nextOut() string {
	p.t.Helper()
	select {
	case l := <-p.out:
		return l
	case <-time.After(wait):
		p.t.Fatalf("sovereign printed no line within %v; stderr:\n%s", wait, p.stderrText())
		return ""
	}
}

// alive reports whether process pid exists (a zombie counts as gone: it
// runs nothing).
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state is the field after the parenthesised command name.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// netListen listens on a free loopback port.
func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
