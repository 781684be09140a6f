package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// startHelper starts the test binary as a helper child in mode "ignore-term"
// (it ignores SIGTERM and has a grandchild in its process group) under
// startChild, waits until it is ready and returns it with the grandchild's
// pid.
func startHelper(t *testing.T, kids *children, grace time.Duration) (*child, int) {
	t.Helper()
	spec := childSpec{argv: []string{os.Args[0]}, grace: grace, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c, err := startChild(spec, append(os.Environ(), kids.env("ignore-term")...), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.kill("test cleanup") })
	kids.expect(0, "start")
	gc := kids.expect(0, "grandchild")
	gcPid, _ := strconv.Atoi(field(gc.text, "pid"))
	t.Cleanup(func() { _ = syscall.Kill(gcPid, syscall.SIGKILL) }) // if the test fails
	kids.expect(0, "ready")
	return c, gcPid
}

// superviseEnded runs supervise on c under a holding context that has
// already ended with cause, and returns its outcome and how long it took.
func superviseEnded(t *testing.T, c *child, cause error) (outcome, time.Duration) {
	t.Helper()
	held, end := context.WithCancelCause(context.Background())
	sup := &supervisor{cur: c}
	end(cause)
	began := time.Now()
	done := make(chan outcome, 1)
	go func() { done <- supervise(held, sup, c) }()
	select {
	case out := <-done:
		return out, time.Since(began)
	case <-time.After(wait):
		t.Fatalf("supervise did not return within %v of the step-down", wait)
		return outcome{}, 0
	}
}

// checkGone fails the test unless c has exited and been reaped and the
// grandchild of its process group is gone: supervise must not return (and
// its caller give the lease up) while any of them still runs.
func checkGone(t *testing.T, c *child, gcPid int) {
	t.Helper()
	select {
	case <-c.done:
	default:
		t.Fatal("supervise returned while the command still runs: want it to return only once the command has exited")
	}
	if alive(gcPid) {
		t.Fatalf("supervise returned while the command's grandchild (pid %d) still runs: want its process group gone", gcPid)
	}
}

// TestSuperviseStepDown: when the holding context ends for a reason other
// than a lost lease (the renew deadline passed), the command gets SIGTERM,
// SIGKILL only after the grace, and supervise returns only once it and its
// process group are gone.
func TestSuperviseStepDown(t *testing.T) {
	kids := newChildren(t)
	const grace = time.Second
	c, gcPid := startHelper(t, kids, grace)
	out, took := superviseEnded(t, c, errors.New("renew deadline passed"))
	checkGone(t, c, gcPid)
	if took < grace {
		t.Errorf("supervise returned %v after the step-down, want the command (which ignores SIGTERM) killed only after the grace %v", took, grace)
	}
	if !out.lost || out.code != exitSignalBase+int(syscall.SIGKILL) {
		t.Errorf("got outcome lost=%v code %d, want lost and %d (SIGKILL)", out.lost, out.code, exitSignalBase+int(syscall.SIGKILL))
	}
	if l := kids.next("SIGTERM"); l.conn != 0 || l.text != "signal terminated" {
		t.Fatalf("got child line %+v, want SIGTERM first", l)
	}
	if l := kids.next("the command's end"); l.conn != 0 || !l.eof {
		t.Fatalf("got child line %+v, want the command's end", l)
	}
}

// TestSuperviseLeaseLost: when the store no longer holds the lease, the
// command is killed at once (no SIGTERM, no grace), and supervise returns
// only once it and its process group are gone.
func TestSuperviseLeaseLost(t *testing.T) {
	kids := newChildren(t)
	grace := wait // a grace would make the test time out
	c, gcPid := startHelper(t, kids, grace)
	out, took := superviseEnded(t, c, fmt.Errorf("renewing: %w", backend.ErrLeaseLost))
	checkGone(t, c, gcPid)
	if took >= grace {
		t.Errorf("supervise took %v, want the command killed at once", took)
	}
	if !out.lost || out.code != exitSignalBase+int(syscall.SIGKILL) {
		t.Errorf("got outcome lost=%v code %d, want lost and %d (SIGKILL)", out.lost, out.code, exitSignalBase+int(syscall.SIGKILL))
	}
	if l := kids.next("the command's end"); l.conn != 0 || !l.eof {
		t.Fatalf("got child line %+v, want the command killed at once, without SIGTERM first", l)
	}
}

// TestSupervisorSignalBeforeStart: SIGINT or SIGTERM received while no
// command runs ends the campaign (another signal does not), and no command
// starts afterwards even if sovereign gets the lease meanwhile; sovereign
// then exits 128+N.
func TestSupervisorSignalBeforeStart(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			var sup supervisor
			sigs := make(chan os.Signal, 2)
			stopped := make(chan struct{})
			handled := make(chan struct{})
			go func() {
				sup.handle(sigs, func() { close(stopped) })
				close(handled)
			}()
			// SIGHUP first: with no command running it is dropped, and it
			// is not what sovereign exits with.
			sigs <- syscall.SIGHUP
			sigs <- sig
			select {
			case <-stopped:
			case <-time.After(wait):
				t.Fatalf("%v with no command running did not stop the campaign within %v", sig, wait)
			}
			close(sigs)
			<-handled
			spec := childSpec{argv: []string{"true"}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			c, err := sup.start(spec, os.Environ(), nil)
			if c != nil {
				c.kill("test")
			}
			if !errors.Is(err, errSignalled) {
				t.Fatalf("start after %v: got %v, %v; want no command and errSignalled", sig, c, err)
			}
			if code, ok := sup.signalled(); !ok || code != exitSignalBase+int(sig) {
				t.Fatalf("signalled: got %d, %v; want %d", code, ok, exitSignalBase+int(sig))
			}
		})
	}
}
