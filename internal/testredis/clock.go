package testredis

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// clockShimSource is a small C library that a redis-server started with
// Config.SteppableClock loads with LD_PRELOAD: it adds the nanoseconds
// stored in a file to the process's wall clock (CLOCK_REALTIME,
// gettimeofday, time), and leaves its monotonic clock alone, as an NTP step
// does. Redis times key expiry and TIME by the wall clock, so a step forward
// ends leases early. libfaketime does the same but deadlocks at start in a
// redis-server linked with jemalloc (its clock reads recurse through
// malloc); the shim calls the kernel directly and allocates nothing.
//
//go:embed clockshim/clockshim.c
var clockShimSource []byte

var clockShim struct {
	once sync.Once
	path string
	err  error
}

// clockShimPath compiles the shim once per test binary, with the C compiler
// on PATH (cc), into a temporary directory, and returns the library's path.
func clockShimPath() (string, error) {
	clockShim.once.Do(func() {
		cc, err := exec.LookPath("cc")
		if err != nil {
			clockShim.err = fmt.Errorf("no C compiler to build the clock shim (install gcc): %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "sovereign-clockshim-")
		if err != nil {
			clockShim.err = err
			return
		}
		src, lib := filepath.Join(dir, "clockshim.c"), filepath.Join(dir, "clockshim.so")
		if err := os.WriteFile(src, clockShimSource, 0o600); err != nil {
			clockShim.err = err
			return
		}
		if out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
			clockShim.err = fmt.Errorf("building the clock shim: %v: %s", err, out)
			return
		}
		clockShim.path = lib
	})
	return clockShim.path, clockShim.err
}

// clockFile is the name, in the server's directory, of the file that holds
// the offset of its wall clock (8 bytes, little-endian nanoseconds).
const clockFile = "clock-offset"

// StepClock steps the server's wall clock by d (forward when positive): from
// the server's next clock reading on, its TIME and its key expiry see the
// step, and its monotonic clock does not. Steps add up, and survive a
// Restart. The server must have been started with Config.SteppableClock.
func (s *Server) StepClock(t testing.TB, d time.Duration) {
	t.Helper()
	if err := s.stepClock(d); err != nil {
		t.Fatalf("testredis: step the clock by %v: %v", d, err)
	}
}

func (s *Server) stepClock(d time.Duration) error {
	if !s.cfg.SteppableClock || s.external {
		return errors.New("the server was not started with Config.SteppableClock")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(s.dir, clockFile), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return err
	}
	off := int64(binary.LittleEndian.Uint64(b[:])) + int64(d)
	binary.LittleEndian.PutUint64(b[:], uint64(off))
	// One aligned 8-byte write: the shim maps the file and reads the value
	// with one load.
	_, err = f.WriteAt(b[:], 0)
	return err
}

// clockEnv prepares the offset file (once: steps survive restarts) and
// returns the environment that loads the shim.
func (s *Server) clockEnv() ([]string, error) {
	lib, err := clockShimPath()
	if err != nil {
		return nil, err
	}
	p := filepath.Join(s.dir, clockFile)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(p, make([]byte, 8), 0o600); err != nil {
			return nil, err
		}
	}
	return append(os.Environ(), "LD_PRELOAD="+lib, "SOVEREIGN_CLOCK_OFFSET_FILE="+p), nil
}
