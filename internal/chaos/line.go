package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// Kinds of log lines a candidate writes (Line.Ev).
const (
	// EvStart is the first line: the candidate's ID (its process name),
	// Instance (the instance ID it campaigns as), pid and options.
	EvStart = "start"
	// EvAcquire is a successful backend Acquire: Term, TTL (granted), Sent
	// and Done.
	EvAcquire = "acquire"
	// EvRenew is a backend Renew of Term: Sent, Done, and Err when it failed.
	EvRenew = "renew"
	// EvHeartbeat is a backend Heartbeat: Sent, Done, Err.
	EvHeartbeat = "heartbeat"
	// EvRelease is a backend Release of Term: Sent, Done, Err.
	EvRelease = "release"
	// EvAcquired is the LeadershipAcquired event, T when the listener ran.
	EvAcquired = "acquired"
	// EvLost is the LeadershipLost event: Term, Reason, T when the listener
	// ran (never earlier than the step-down itself).
	EvLost = "lost"
	// EvLead is the start of the leader function for Term, at T.
	EvLead = "lead"
	// EvWrite is one write to the fenced store: Term, Seq, Pre (just before
	// the leadership check), Post (just after it passed), Sent, Done and
	// Status.
	EvWrite = "write"
	// EvCtxLag reports that IsLeader was already false at Pre while the
	// leader context was not yet cancelled; T is when the context's Done
	// channel was seen closed.
	EvCtxLag = "ctxlag"
	// EvFnEnd is the leader function returning, at T (after it saw its
	// context cancelled).
	EvFnEnd = "fnend"
	// EvExit is the last line of a clean exit: T, Goroutines left.
	EvExit = "exit"
)

// Write statuses (Line.Status).
const (
	StatusAccepted = "accepted"
	StatusRejected = "rejected"
	StatusError    = "error"
)

// Line is one JSON line of a candidate's log. Times are Now() readings
// (CLOCK_MONOTONIC nanoseconds); durations are nanoseconds.
type Line struct {
	Ev       string `json:"ev"`
	ID       string `json:"id,omitempty"`
	Instance string `json:"instance,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	T        int64  `json:"t,omitempty"`
	Term     uint64 `json:"term,omitempty"`
	Seq      uint64 `json:"seq,omitempty"`
	Sent     int64  `json:"sent,omitempty"`
	Done     int64  `json:"done,omitempty"`
	Pre      int64  `json:"pre,omitempty"`
	Post     int64  `json:"post,omitempty"`
	TTL      int64  `json:"ttl,omitempty"`
	Status   string `json:"status,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Err      string `json:"err,omitempty"`

	// Options, on the start line.
	OptTTL           int64 `json:"opt_ttl,omitempty"`
	OptRenewDeadline int64 `json:"opt_renew_deadline,omitempty"`
	OptRenewInterval int64 `json:"opt_renew_interval,omitempty"`
	OptHeartbeatTTL  int64 `json:"opt_heartbeat_ttl,omitempty"`

	Goroutines int `json:"goroutines,omitempty"`
}

// Logger writes Lines to a file, one write(2) per line, so that a process
// killed with SIGKILL loses at most the line it was writing. It is safe for
// concurrent use.
type Logger struct {
	mu sync.Mutex // guards f, err
	f  io.Writer
	// err is the first write error; later lines are dropped.
	err error
}

// NewLogger returns a Logger writing to w.
func NewLogger(w io.Writer) *Logger { return &Logger{f: w} }

// Log writes l as one line.
func (g *Logger) Log(l Line) {
	b, err := json.Marshal(l)
	if err != nil {
		panic(fmt.Sprintf("chaos: marshal log line: %v", err))
	}
	b = append(b, '\n')
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return
	}
	_, g.err = g.f.Write(b)
}

// Err returns the first write error, if any.
func (g *Logger) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// ReadLines reads a candidate's log. A torn last line (the process was
// killed while writing it) is ignored; any other malformed line is an error.
func ReadLines(path string) ([]Line, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []Line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var bad error
	for sc.Scan() {
		if bad != nil {
			return nil, bad
		}
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			bad = fmt.Errorf("%s: line %d: %w", path, len(lines)+1, err)
			continue
		}
		lines = append(lines, l)
	}
	return lines, sc.Err()
}

// SaveRun writes run (without the processes' log lines, which live in their
// own files) as JSON to path, so that a run can be analysed again later with
// LoadRun.
func SaveRun(path string, run Run) error {
	run.Procs = slices.Clone(run.Procs)
	for i := range run.Procs {
		run.Procs[i].Lines = nil
	}
	b, err := json.MarshalIndent(run, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// LoadRun reads a run saved by SaveRun from dir/run.json, with the log of
// each process from dir/<id>.jsonl.
func LoadRun(dir string) (Run, error) {
	var run Run
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		return run, err
	}
	if err := json.Unmarshal(b, &run); err != nil {
		return run, err
	}
	for i, p := range run.Procs {
		if run.Procs[i].Lines, err = ReadLines(filepath.Join(dir, p.ID+".jsonl")); err != nil {
			return run, err
		}
	}
	return run, nil
}
