package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The watchdog is sovereign's dead man's switch for the command of run and
// lock. Sovereign stops the command at the renew deadline, and the
// parent-death signal kills the command when sovereign dies, but neither
// helps when sovereign itself is paused (SIGSTOP, a debugger, a stopped
// cgroup of its own) while its command runs on: the lease then expires and
// a successor starts its command beside this one. And the parent-death
// signal reaches only the command, not the children it started.
//
// So next to the command, in the command's process group, sovereign starts
// a second process: itself, with the one argument watchdogArg. Sovereign
// sends it, over a pipe, the time by which the command must be gone, again
// after every renewal: halfway between the time sovereign would SIGKILL the
// group itself (the renew deadline of the lease plus the grace) and the
// earliest expiry of the lease (the deadline plus TTL - RenewDeadline), so
// that it never races a sovereign that runs (child.killBy). That time is sent as an
// absolute reading of CLOCK_MONOTONIC, shared by every process of the
// system, so a message delayed by a pause of sovereign is still exact. When
// that time passes without a later one, or the pipe reaches its end
// (sovereign died), the watchdog sends SIGKILL to its own process group:
// the command, every process it started in its group, and the watchdog
// itself. It ignores the signals sovereign forwards to the group. Because
// it is a member of the group, the group's ID cannot be reused while it
// watches. In every other case sovereign's own SIGKILL of the group, once
// the command has exited, ends the watchdog too.

// watchdogArg is the argument that makes sovereign a watchdog (see above).
// It is not a command of the command line and never shown.
const watchdogArg = "\x01sovereign-watchdog"

// watchdogFD is the watchdog's descriptor of the deadlines pipe's read
// end; firedFD that of the write end of the pipe on which it says, before
// it kills the group, that it does so.
const (
	watchdogFD = 3
	firedFD    = 4
)

// watchdogPoll bounds how often a watchdog feeder looks for a new
// deadline: within a fraction of the margin between the renew deadline and
// the TTL, and never more often than every 10 ms.
func watchdogPoll(margin time.Duration) time.Duration {
	return min(max(margin/8, 10*time.Millisecond), 250*time.Millisecond)
}

// monoNow returns CLOCK_MONOTONIC in nanoseconds, the clock of Go's
// monotonic readings on Linux.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err)) // never fails on Linux
	}
	return ts.Nano()
}

// watchdog is sovereign's side of a command's watchdog.
type watchdog struct {
	w     *os.File  // the deadlines pipe's write end
	fired *os.File  // the read end of the pipe the watchdog says it fired on
	sent  time.Time // the last deadline sent
}

// startWatchdog starts the watchdog of the command whose process group is
// pgid, which must not have been reaped yet, with the first deadline.
func startWatchdog(pgid int, deadline time.Time) (*watchdog, error) {
	// The running binary itself, even if its file was replaced or deleted
	// since (an upgrade in place).
	const self = "/proc/self/exe"
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	defer r.Close()
	fr, fw, err := os.Pipe()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	defer fw.Close()
	cmd := &exec.Cmd{
		Path:        self,
		Args:        []string{"sovereign", watchdogArg},
		Env:         []string{}, // nothing it needs; SOVEREIGN_BACKEND (a password, maybe) stays out of the command's group
		Stderr:      os.Stderr,
		ExtraFiles:  []*os.File{r, fw}, // descriptors 3 and 4
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pgid: pgid},
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		fr.Close()
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	// Never waited for here: it is reaped with the command's process group
	// (killGroup).
	wd := &watchdog{w: w, fired: fr}
	if err := wd.send(deadline); err != nil {
		_ = cmd.Process.Kill()
		wd.close()
		return nil, err
	}
	return wd, nil
}

// hasFired reports whether the watchdog said it killed the group. It does
// so before the kill, so once the command is gone the answer is final.
func (wd *watchdog) hasFired() bool {
	rc, err := wd.fired.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	_ = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _ = syscall.Read(int(fd), b[:]) // one attempt: the pipe is non-blocking
		return true
	})
	return n == 1
}

// send tells the watchdog the time by which the command must be gone.
func (wd *watchdog) send(deadline time.Time) error {
	abs := monoNow() + int64(time.Until(deadline))
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(abs))
	if _, err := wd.w.Write(buf[:]); err != nil {
		return fmt.Errorf("watchdog: %w", err)
	}
	wd.sent = deadline
	return nil
}

// close closes the pipes. The watchdog, if still running, then ends the
// group: call it only once the group is gone or to be killed anyway.
func (wd *watchdog) close() {
	wd.w.Close()
	wd.fired.Close()
}

// runWatchdogIfAsked runs the watchdog and exits when sovereign was started
// as one.
func runWatchdogIfAsked() {
	if len(os.Args) == 2 && os.Args[1] == watchdogArg {
		os.Exit(watchdogMain())
	}
}

// watchdogMain is the watchdog process (see above).
func watchdogMain() int {
	signal.Ignore(forwarded...)                          // they are for the command
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)) // as run's and lock's
	for _, fd := range []int{watchdogFD, firedFD} {
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			// Not started by sovereign: never kill a group it was not put in.
			log.Error("sovereign: watchdog: not started by sovereign run or lock", "fd", fd)
			return exitUsage
		}
	}
	if err := syscall.SetNonblock(watchdogFD, true); err != nil {
		log.Error("sovereign: watchdog: SIGKILL to the command's process group", "pgid", syscall.Getpgrp(), "err", err)
		return killOwnGroup()
	}
	f := os.NewFile(watchdogFD, "deadlines")
	var buf [8]byte
	have := false
	var deadline int64
	for {
		if have {
			_ = f.SetReadDeadline(time.Now().Add(time.Duration(deadline - monoNow())))
		}
		_, err := io.ReadFull(f, buf[:])
		if err == nil {
			deadline, have = int64(binary.LittleEndian.Uint64(buf[:])), true
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			_, _ = os.NewFile(firedFD, "fired").Write([]byte{1})
			log.Error("sovereign: watchdog: the lease's deadline passed without a word from sovereign (paused?): SIGKILL to the command's process group", "pgid", syscall.Getpgrp())
		} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			log.Error("sovereign: watchdog: SIGKILL to the command's process group", "pgid", syscall.Getpgrp(), "err", err)
		}
		// At the end of the pipe, sovereign has died or is done with the
		// command: either way the group must go, quietly.
		return killOwnGroup()
	}
}

// killOwnGroup sends SIGKILL to the caller's process group, the caller
// included.
func killOwnGroup() int {
	_ = syscall.Kill(0, syscall.SIGKILL)
	return 1 // not reached
}
