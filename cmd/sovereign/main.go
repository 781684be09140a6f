// Command sovereign is the operators' side of Sovereign: it shows who holds
// an election or a lock, follows changes, runs a command only while this
// machine leads (or holds a lock), and serves a live status page.
//
// Usage:
//
//	sovereign [backend flags] COMMAND [flags] ARGS
//
//	status NAME              holder, since, term, TTL left, heartbeat, metadata, members;
//	                         for a shared lock every holder with its mode
//	watch NAME               one line per change of holder, including "no leader"
//	list [PREFIX]            every held election and lock beginning with PREFIX
//	members NAME             the instances with a live heartbeat
//	run ELECTION -- CMD...   campaign; run CMD while leading; stop it before a successor can start
//	lock KEY -- CMD...       run CMD while holding the lock KEY (--try, --wait D;
//	                         --shared [--limit N], --hierarchical, --fair)
//	break KEY --term N       forced release of exactly that term's lease
//	serve --http :4040       a live status page, /healthz and /metrics
//
// The backend comes from --backend URL or the SOVEREIGN_BACKEND environment
// variable: redis://, rediss://, unix:// (go-redis ParseURL),
// redis+sentinel://host:26379?master_name=M (ParseFailoverURL),
// redis+cluster://host:7000?addr=host2:7000 (ParseClusterURL),
// etcd://host:2379,host2:2379 (etcds:// for TLS; --cacert, --cert, --key,
// --user as in etcdctl; the password from the URL or --password-file, never
// from a flag of its own), or memory:// for demos.
//
// # The command under run and lock
//
// The command is executed directly (--shell runs it with /bin/sh -c), in a
// process group of its own, with SIGKILL as its parent-death signal on Linux,
// and with SOVEREIGN_ELECTION (run) or SOVEREIGN_KEY (lock),
// SOVEREIGN_HOLDER_ID and SOVEREIGN_TERM (the fencing term) in its
// environment; SOVEREIGN_BACKEND (which may hold a password) and the lease's
// token are never passed. SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are
// forwarded to its process group. When leadership or the lock is lost (the
// renew deadline passed, or the store no longer holds the lease), the
// command's group gets SIGTERM at once and SIGKILL after --grace, which
// defaults to half of TTL - RenewDeadline and must be less than it: the
// holder steps down RenewDeadline after its last successful renewal was
// sent, and the store keeps the lease TTL after receiving it, so the command
// is dead before a successor can acquire the lease. On Linux that holds even
// when sovereign itself does not run: a watchdog process (sovereign
// re-executed) sits in the command's process group, is told the lease's
// deadline after every renewal, and sends SIGKILL to the whole group when
// sovereign has not stopped it halfway between sovereign's own SIGKILL and
// the lease's expiry (sovereign paused alone by SIGSTOP or a debugger), or
// at once when sovereign dies (the parent-death signal reaches the command
// alone, not the processes it started); sovereign, continued, then exits 79.
// The lease is released only after the command has exited and whatever was
// left of its process group has been killed and reaped (sovereign is a child
// subreaper on Linux). With --min-hold, lock keeps the lock after the
// command exited until that long after taking it, then releases it and
// exits: a job started from cron on every replica runs once a period even
// when one replica's tick comes after the job finished elsewhere.
//
// # Shared locks, semaphores, hierarchies
//
// lock --shared takes KEY in Shared mode: any number of --shared holders run
// their commands at once (at most N with --limit N: a semaphore of N
// permits; every holder must give the same N, else exit 64), while no
// exclusive holder does, and a waiting exclusive lock keeps new shared
// holders out so that it is not starved. Each holder has its own lease,
// term (SOVEREIGN_TERM) and TTL, so a crashed holder frees its permit at its
// own TTL. --hierarchical treats "/" in KEY as levels (a lock on a/b/c also
// takes intent on a and a/b), and --fair serves waiters in arrival order
// across processes. A backend that cannot serve these options (one without
// backend.Modes) exits 64. When the lock is held, --try and --wait exit 75
// and name every holder with its mode, term, age and TTL left; status
// --lock KEY shows every holder of a shared key, and list one row per
// holder with its mode (shared/N for a limit of N).
//
// # Exit codes
//
//	0        success; status: held (with --exit-status)
//	N        run, lock: the command's own exit status
//	128+N    run, lock: the command was killed by signal N; or sovereign got
//	         signal N (SIGINT, SIGTERM) before the command started
//	3        status --exit-status: nobody holds it; break: that term does not hold it
//	64       usage: bad flags or arguments; lock: options the backend cannot
//	         serve, or a --limit other than the live shared holders'
//	69       the backend could not be reached
//	70       an unexpected error
//	75       held by someone else, not acquired (lock --try, lock --wait, run --wait)
//	79       leadership or the lock was lost while the command ran; it was stopped
//	126      the command could not be executed
//	127      the command was not found
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Exit codes. The child's own exit status is passed through unchanged by run
// and lock, so a child can produce any of these too; they are chosen from
// the BSD sysexits range, which few programs use.
const (
	exitOK          = 0
	exitFree        = 3   // status --exit-status: nobody holds it; break: that term does not hold it
	exitUsage       = 64  // EX_USAGE: bad command line
	exitUnavailable = 69  // EX_UNAVAILABLE: the backend could not be reached
	exitSoftware    = 70  // EX_SOFTWARE: an unexpected error
	exitHeld        = 75  // EX_TEMPFAIL: held by someone else, not acquired
	exitLost        = 79  // leadership or the lock was lost while the command ran; the command was stopped
	exitCannotExec  = 126 // the command was found but could not be executed
	exitNotFound    = 127 // the command was not found
	exitSignalBase  = 128 // 128+N: the command (or, before it started, sovereign) was ended by signal N
)

// exitError carries an exit code to main.
type exitError struct {
	code int
	err  error // may be nil: exit quietly with code
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitWith returns an error that makes main exit with code, printing err
// when it is not nil.
func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// usageError reports a bad command line (exit 64).
func usageError(format string, args ...any) error {
	return exitWith(exitUsage, fmt.Errorf(format, args...))
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

// env is what every subcommand shares: the streams and the backend flags
// given before the subcommand.
type env struct {
	stdout, stderr io.Writer
	backend        backendFlags
	// openHook, when set, replaces opening the backend from the flags: tests
	// run commands in-process on a shared memory store with it.
	openHook func() (*opened, error)
}

// open opens the backend the flags name.
func (e *env) open() (*opened, error) {
	if e.openHook != nil {
		return e.openHook()
	}
	return e.backend.open()
}

func commands() []command {
	return []command{
		{"status", "status NAME: who holds NAME (--exit-status: 0 held, 3 free; -o json)", cmdStatus},
		{"watch", "watch NAME: one line per change of holder, including \"no leader\"", cmdWatch},
		{"list", "list [PREFIX]: every held election and lock beginning with PREFIX", cmdList},
		{"members", "members NAME: the instances with a live heartbeat", cmdMembers},
		{"run", "run ELECTION -- CMD [ARGS...]: run CMD while this instance leads ELECTION", cmdRun},
		{"lock", "lock KEY -- CMD [ARGS...]: run CMD while holding the lock KEY", cmdLock},
		{"break", "break KEY --term N: forced release of exactly that term's lease (dangerous)", cmdBreak},
		{"serve", "serve --http :4040: live status page, /healthz and /metrics", cmdServe},
	}
}

func main() {
	runWatchdogIfAsked()
	redis.SetLogger(quietRedis{}) // failures reach the user through our own errors
	os.Exit(mainArgs(context.Background(), &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:]))
}

// quietRedis discards go-redis's internal log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// mainArgs runs the command line args and returns the exit code.
func mainArgs(ctx context.Context, e *env, args []string) int {
	stdout, stderr := e.stdout, e.stderr
	e.backend.url = os.Getenv("SOVEREIGN_BACKEND")
	fs := flag.NewFlagSet("sovereign", flag.ContinueOnError)
	fs.SetOutput(stderr)
	e.backend.register(fs)
	fs.Usage = func() { printUsage(stderr, fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() == 0 {
		printUsage(stderr, fs)
		return exitUsage
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		printUsage(stdout, fs)
		return exitOK
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(ctx, e, rest)
		return report(stderr, err)
	}
	fmt.Fprintf(stderr, "sovereign: unknown command %q\n", name)
	printUsage(stderr, fs)
	return exitUsage
}

// report prints err (if any) and returns its exit code.
func report(stderr io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && !errors.Is(ee.err, errFlagsReported) {
			fmt.Fprintf(stderr, "sovereign: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "sovereign: %v\n", err)
	return exitSoftware
}

func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: sovereign [backend flags] COMMAND [flags] ARGS\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %s\n", c.summary)
	}
	fmt.Fprintf(w, "\nBackend flags (also accepted after the command):\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, `
Exit codes: 0 ok; run/lock: the command's own status (128+N if killed by
signal N, 126 not executable, 127 not found); 3 not held (status
--exit-status, break); 64 usage; 69 backend unreachable; 70 internal error;
75 held by someone else (lock --try/--wait); 79 lost while the command ran.
`)
}

// errFlagsReported marks a usage error the flag package already printed.
var errFlagsReported = errors.New("bad flags")

// newFlagSet returns a flag set for subcommand name that also accepts the
// backend flags, with the values given before the subcommand as defaults.
func newFlagSet(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("sovereign "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	e.backend.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: sovereign %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses flags given anywhere among the first npos positional
// arguments, so both "status -o json NAME" and "status NAME -o json" work.
// After npos positionals, or after "--", parsing stops and the remaining
// arguments are returned as tail (the command of run and lock).
func parseArgs(fs *flag.FlagSet, args []string, npos int) (pos, tail []string, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, err
			}
			return nil, nil, exitWith(exitUsage, errFlagsReported)
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return pos, rest, nil
		}
		if len(rest) == 0 {
			return pos, nil, nil
		}
		if len(pos) == npos {
			return pos, rest, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// exactArgs parses args, requiring between min and max positionals and no
// tail.
func exactArgs(fs *flag.FlagSet, args []string, min, max int) ([]string, error) {
	pos, tail, err := parseArgs(fs, args, max)
	if err != nil {
		return nil, err
	}
	if len(tail) > 0 {
		return nil, usageError("unexpected arguments: %s", strings.Join(tail, " "))
	}
	if len(pos) < min {
		fs.Usage()
		return nil, exitWith(exitUsage, errFlagsReported)
	}
	return pos, nil
}

// commandArgs parses the args of run and lock: one positional NAME, then
// the command and its arguments (after "--", or after NAME), which must
// not be empty.
func commandArgs(fs *flag.FlagSet, args []string) (name string, argv []string, err error) {
	pos, argv, err := parseArgs(fs, args, 1)
	if err != nil {
		return "", nil, err
	}
	if len(pos) != 1 || len(argv) == 0 {
		fs.Usage()
		return "", nil, exitWith(exitUsage, errFlagsReported)
	}
	return pos[0], argv, nil
}
