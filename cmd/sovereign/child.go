package main

import (
	"github.com/sovereign-go/sovereign/backend"

	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// forwarded are the signals sovereign passes on to the child's process
// group while a child runs.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// childSpec says how to start the child.
type childSpec struct {
	argv   []string
	shell  bool // run argv joined by spaces with /bin/sh -c
	grace  time.Duration
	margin time.Duration // TTL - RenewDeadline of the lease the child runs under
	log    *slog.Logger
}

// child is a running command in its own process group.
type child struct {
	spec  childSpec
	cmd   *exec.Cmd
	pgid  int
	wd    *watchdog     // the command's watchdog; nil when none
	done  chan struct{} // closed when the child has exited and was reaped
	state *os.ProcessState
}

// childEnv returns the environment of the child: sovereign's own, without
// SOVEREIGN_BACKEND (it may hold a password), with vars set. The lease's
// token is never passed.
func childEnv(vars map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "SOVEREIGN_BACKEND" {
			continue
		}
		if _, ok := vars[k]; ok {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

// startChild starts the command in a process group of its own, with the
// parent-death signal set where the system has one. The error is an
// exitError with code 127 (not found) or 126 (cannot execute). With
// deadline, the renew deadline of the lease the command runs under (zero
// once it has passed), it also starts the command's watchdog (see
// watchdog_linux.go) and keeps it told of killBy of that deadline; if the
// watchdog cannot start where the system has one, the command is killed
// and the error's code is 70.
func startChild(spec childSpec, env []string, deadline func() time.Time) (*child, error) {
	argv := spec.argv
	if spec.shell {
		argv = []string{"/bin/sh", "-c", strings.Join(argv, " ")}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		code := exitNotFound
		if errors.Is(err, fs.ErrPermission) {
			code = exitCannotExec
		}
		return nil, exitWith(code, fmt.Errorf("command %q: %w", argv[0], err))
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        argv,
		Env:         env,
		Stdin:       os.Stdin,
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
		SysProcAttr: sysProcAttr(),
	}
	if err := cmd.Start(); err != nil {
		code := exitCannotExec
		if errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return nil, exitWith(code, fmt.Errorf("command %q: %w", argv[0], err))
	}
	c := &child{spec: spec, cmd: cmd, pgid: cmd.Process.Pid, done: make(chan struct{})}
	if deadline != nil {
		// Before the command can be reaped: its group must still exist
		// for the watchdog to join it.
		if err := c.startWatchdog(deadline); err != nil {
			_ = syscall.Kill(-c.pgid, syscall.SIGKILL)
			_ = cmd.Wait()
			reapGroup(c.pgid)
			return nil, exitWith(exitSoftware, fmt.Errorf("command %q stopped: %w", argv[0], err))
		}
	}
	go func() {
		// Wait's error only repeats what ProcessState says (the I/O is the
		// terminal's, not copied by us).
		_ = cmd.Wait()
		c.state = cmd.ProcessState
		close(c.done)
	}()
	return c, nil
}

// startWatchdog starts the child's watchdog, unless the system has none,
// and a goroutine that tells it every later deadline until the child has
// exited.
func (c *child) startWatchdog(deadline func() time.Time) error {
	first := deadline()
	if first.IsZero() {
		first = time.Now() // already past: the watchdog fires at once, after the grace
	}
	wd, err := startWatchdog(c.pgid, c.killBy(first))
	if errors.Is(err, errors.ErrUnsupported) {
		return nil
	}
	if err != nil {
		return err
	}
	c.wd = wd
	go func() {
		t := time.NewTicker(watchdogPoll(c.spec.margin))
		defer t.Stop()
		for {
			select {
			case <-c.done:
				return
			case <-t.C:
			}
			d := deadline()
			if d.IsZero() || !c.killBy(d).After(wd.sent) {
				continue
			}
			if err := wd.send(c.killBy(d)); err != nil {
				select {
				case <-c.done: // the group is gone, the watchdog with it
				default:
					c.spec.log.Error("sovereign: the command's watchdog cannot be told the lease's new deadline; it will kill the command at the last one", "err", err)
				}
				return
			}
		}
	}()
	return nil
}

// killBy returns when the watchdog kills the command's group if the renew
// deadline of its lease is deadline and sovereign has not stopped it by
// then: halfway between sovereign's own SIGKILL (the deadline plus the
// grace) and the earliest expiry of the lease at the store (the deadline
// plus the margin), so that it never races a sovereign that runs.
func (c *child) killBy(deadline time.Time) time.Time {
	return deadline.Add(c.spec.grace + (c.spec.margin-c.spec.grace)/2)
}

// signal sends sig to the child's whole process group.
func (c *child) signal(sig syscall.Signal) {
	if err := syscall.Kill(-c.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		c.spec.log.Warn("sovereign: signalling the command's process group failed", "pgid", c.pgid, "signal", sig, "err", err)
	}
}

// stop ends the child: SIGTERM to its process group, SIGKILL after the
// grace, then it waits until the child has exited and kills what is left of
// its group.
func (c *child) stop(reason string) {
	select {
	case <-c.done:
	default:
		c.spec.log.Warn("sovereign: stopping the command: SIGTERM to its process group", "reason", reason, "pid", c.pgid, "grace", c.spec.grace)
		c.signal(syscall.SIGTERM)
		t := time.NewTimer(c.spec.grace)
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
			c.spec.log.Warn("sovereign: the command did not exit within the grace: SIGKILL to its process group", "pid", c.pgid, "grace", c.spec.grace)
			c.signal(syscall.SIGKILL)
			<-c.done
		}
	}
	c.killGroup()
}

// kill ends the child at once: SIGKILL to its process group, then it waits
// until the child has exited and kills what is left of its group.
func (c *child) kill(reason string) {
	select {
	case <-c.done:
	default:
		c.spec.log.Warn("sovereign: stopping the command at once: SIGKILL to its process group", "reason", reason, "pid", c.pgid)
		c.signal(syscall.SIGKILL)
	}
	c.killGroup()
}

// killGroup kills whatever is left of the child's process group (the
// command's own children) once the command itself has exited, and waits a
// bounded time for them to be gone.
func (c *child) killGroup() {
	<-c.done
	if c.wd != nil {
		defer c.wd.close()
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		if err := syscall.Kill(-c.pgid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
			return
		}
		reapGroup(c.pgid)
		if err := syscall.Kill(-c.pgid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			c.spec.log.Error("sovereign: processes of the command's group survive SIGKILL", "pgid", c.pgid)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reapGroup reaps every exited process of process group pgid that is a
// child of sovereign, without blocking.
func reapGroup(pgid int) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-pgid, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}

// exitCode returns the child's exit status: its own code, or 128+N when
// signal N ended it.
func (c *child) exitCode() int {
	<-c.done
	if ws, ok := c.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignalBase + int(ws.Signal())
	}
	return c.state.ExitCode()
}

// describe returns how the child ended, for logs.
func (c *child) describe() string {
	<-c.done
	return c.state.String()
}

// supervisor runs at most one child at a time and forwards signals to it.
type supervisor struct {
	mu  sync.Mutex // guards cur, sig
	cur *child     // the running child, nil when none
	sig os.Signal  // the first INT or TERM received while no child ran
}

// start starts a child unless a terminating signal arrived already.
func (s *supervisor) start(spec childSpec, env []string, deadline func() time.Time) (*child, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sig != nil {
		return nil, errSignalled
	}
	c, err := startChild(spec, env, deadline)
	if err != nil {
		return nil, err
	}
	s.cur = c
	return c, nil
}

// clear forgets the child once it has exited.
func (s *supervisor) clear() {
	s.mu.Lock()
	s.cur = nil
	s.mu.Unlock()
}

var errSignalled = errors.New("signalled before the command started")

// errWatchdogFired is why a command ended that its watchdog killed: the
// lease's deadline and grace passed while sovereign did not run.
var errWatchdogFired = fmt.Errorf("%w: the renew deadline and grace passed while sovereign did not run (paused?); the command's watchdog killed its process group", backend.ErrLeaseLost)

// handle receives signals until sigs closes. A signal is forwarded to the
// running child's process group; SIGINT or SIGTERM with no child running
// calls stop (sovereign then exits 128+N).
func (s *supervisor) handle(sigs <-chan os.Signal, stop func()) {
	for sig := range sigs {
		s.mu.Lock()
		c := s.cur
		if c == nil && (sig == syscall.SIGINT || sig == syscall.SIGTERM) && s.sig == nil {
			s.sig = sig
			s.mu.Unlock()
			stop()
			continue
		}
		s.mu.Unlock()
		if c != nil {
			c.signal(sig.(syscall.Signal))
		}
	}
}

// signalled returns the exit code for the terminating signal received while
// no child ran, if any.
func (s *supervisor) signalled() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sig == nil {
		return 0, false
	}
	return exitSignalBase + int(s.sig.(syscall.Signal)), true
}

// defaultID returns the default instance ID: host name and process ID.
func defaultID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "unknown"
	}
	return h + "-" + strconv.Itoa(os.Getpid())
}

// outcome is how a supervised command ended.
type outcome struct {
	// lost reports that the holding context ended first and the command was
	// stopped; cause is why.
	lost  bool
	cause error
	// code is the command's exit status (meaningless when lost).
	code   int
	status string // the command's end, for logs
}

// supervise runs the started child c until it exits by itself, or until
// held ends, in which case it stops the child (SIGTERM to its process
// group, SIGKILL after the grace). Either way it returns only once the
// child has exited and what was left of its process group is gone, so the
// caller may then give the lease up.
func supervise(held context.Context, sup *supervisor, c *child) outcome {
	defer sup.clear()
	select {
	case <-c.done:
		fired := c.wd != nil && c.wd.hasFired() // said before the kill, so final now
		c.killGroup()
		if fired {
			return outcome{lost: true, cause: errWatchdogFired, code: c.exitCode(), status: c.describe()}
		}
		return outcome{code: c.exitCode(), status: c.describe()}
	case <-held.Done():
	}
	cause := context.Cause(held)
	if errors.Is(cause, backend.ErrLeaseLost) {
		// The store no longer holds the lease: a successor may already be
		// running, so there is no margin left for a grace.
		c.kill(cause.Error())
	} else {
		c.stop(cause.Error())
	}
	return outcome{lost: true, cause: cause, code: c.exitCode(), status: c.describe()}
}
