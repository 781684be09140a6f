package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
)

// metadataFlag collects repeated --metadata k=v.
type metadataFlag map[string]string

func (m metadataFlag) String() string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (m metadataFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	m[k] = v
	return nil
}

// holdFlags are the flags run and lock share.
type holdFlags struct {
	ttl           time.Duration
	renewDeadline time.Duration
	grace         time.Duration
	id            string
	shell         bool
	quiet         bool
	metadata      metadataFlag
}

func (h *holdFlags) register(fs *flag.FlagSet) {
	h.metadata = metadataFlag{}
	fs.DurationVar(&h.ttl, "ttl", sovereign.DefaultTTL, "lease time to live: how long a crashed holder's lease outlives it")
	fs.DurationVar(&h.renewDeadline, "renew-deadline", 0, "step down this long after the last successful renewal was sent (default 7/10 of --ttl)")
	fs.DurationVar(&h.grace, "grace", 0, "after stepping down, SIGKILL the command this long after SIGTERM; must be less than ttl - renew-deadline (default half of it)")
	fs.StringVar(&h.id, "id", defaultID(), "instance `ID` shown as the holder")
	fs.BoolVar(&h.shell, "shell", false, "run the command with /bin/sh -c (its arguments joined by spaces)")
	fs.BoolVar(&h.quiet, "quiet", false, "log only warnings and errors")
	fs.Var(h.metadata, "metadata", "`key=value` stored with the lease and shown by status (repeatable)")
}

// logger returns the logger of run and lock: text on stderr.
func (h *holdFlags) logger(env *env) *slog.Logger {
	level := slog.LevelInfo
	if h.quiet {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: level}))
}

// meta returns the lease metadata: host, pid and command name, then the
// user's --metadata.
func (h *holdFlags) meta(argv []string) map[string]string {
	md := map[string]string{"pid": strconv.Itoa(os.Getpid()), "cmd": filepath.Base(argv[0])}
	if host, err := os.Hostname(); err == nil {
		md["host"] = host
	}
	for k, v := range h.metadata {
		md[k] = v
	}
	return md
}

// checkGrace applies the default grace and rejects one that would let the
// command outlive the lease: the holder steps down at its renew deadline and
// the backend keeps the lease for TTL, so the command must be dead within
// TTL - RenewDeadline of the step-down.
func checkGrace(grace, ttl, renewDeadline time.Duration) (time.Duration, error) {
	margin := ttl - renewDeadline
	switch {
	case grace < 0:
		return 0, usageError("--grace must not be negative")
	case grace == 0:
		return margin / 2, nil
	case grace >= margin:
		return 0, usageError("--grace %v must be less than ttl - renew-deadline (%v - %v = %v): the command must be dead before the lease can expire and a successor start",
			grace, ttl, renewDeadline, margin)
	}
	return grace, nil
}

// holding is what run and lock set up before they campaign: the spec of
// the command, the supervisor that runs it, and the signals forwarded to it.
type holding struct {
	spec childSpec
	sup  supervisor
	// ctx is the campaign's context: it ends on cancel, or when SIGINT or
	// SIGTERM arrives while no command runs.
	ctx    context.Context
	cancel context.CancelFunc
	sigs   chan os.Signal
}

// startHolding is the start-up run and lock share. It applies and checks
// --grace against the lease's ttl and renewDeadline, forwards signals to
// the supervisor, probes the backend for key (within the command timeout)
// and makes sovereign a child subreaper where it can. On success the caller
// must call close when done; on error nothing is left to close, and a
// terminating signal received meanwhile is the error's exit code.
func (h *holdFlags) startHolding(ctx context.Context, env *env, b backend.Backend, key string, argv []string, ttl, renewDeadline time.Duration, log *slog.Logger) (*holding, error) {
	grace, err := checkGrace(h.grace, ttl, renewDeadline)
	if err != nil {
		return nil, err
	}
	hs := &holding{
		spec: childSpec{argv: argv, shell: h.shell, grace: grace, margin: ttl - renewDeadline, log: log},
		sigs: make(chan os.Signal, 8),
	}
	hs.ctx, hs.cancel = context.WithCancel(ctx)
	signal.Notify(hs.sigs, forwarded...)
	go hs.sup.handle(hs.sigs, hs.cancel)

	if err := probe(hs.ctx, b, key, env.backend.commandTimeout); err != nil {
		code, signalled := hs.sup.signalled()
		hs.close()
		if signalled {
			return nil, exitWith(code, nil)
		}
		return nil, err
	}
	if err := becomeSubreaper(); err != nil {
		log.Warn("sovereign: cannot become a child subreaper; the command's orphaned children will not be waited for", "err", err)
	}
	return hs, nil
}

// close stops the forwarding of signals, ends the supervisor's handle
// goroutine and cancels the campaign's context.
func (hs *holding) close() {
	signal.Stop(hs.sigs)
	close(hs.sigs) // no more sends once Stop has returned
	hs.cancel()
}

func cmdRun(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "run", "run [flags] ELECTION -- CMD [ARGS...]")
	var h holdFlags
	h.register(fs)
	rejoin := fs.Bool("rejoin", false, "after losing leadership, stop the command and campaign again instead of exiting")
	wait := fs.Duration("wait", 0, "give up (exit 75) if not elected within this long (default: campaign until stopped)")
	name, argv, err := commandArgs(fs, args)
	if err != nil {
		return err
	}
	if *wait < 0 {
		return usageError("--wait must not be negative")
	}
	log := h.logger(env)

	b, err := env.open()
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.ValidateKey(name); err != nil {
		return exitWith(exitUsage, fmt.Errorf("election name: %w", err))
	}
	if h.ttl < b.MinTTL() {
		return usageError("--ttl %v is below the backend's minimum %v", h.ttl, b.MinTTL())
	}
	e, err := sovereign.New(b.Backend, name, h.id, &sovereign.Options{
		TTL:           h.ttl,
		RenewDeadline: h.renewDeadline,
		Metadata:      h.meta(argv),
		Logger:        log,
	})
	if err != nil {
		return exitWith(exitUsage, err)
	}
	eo := e.Options()
	hs, err := h.startHolding(ctx, env, b, name, argv, eo.TTL, eo.RenewDeadline, log)
	if err != nil {
		return err
	}
	defer hs.close()
	runCtx, cancelRun, sup := hs.ctx, hs.cancel, &hs.sup

	var (
		mu      sync.Mutex // guards result, elected
		result  error      // how sovereign exits; set once by the leader function
		elected bool
	)
	setResult := func(err error) {
		mu.Lock()
		if result == nil {
			result = err
		}
		mu.Unlock()
	}
	if *wait > 0 {
		t := time.AfterFunc(*wait, func() {
			mu.Lock()
			if !elected {
				if result == nil {
					result = exitWith(exitHeld, fmt.Errorf("not elected leader of %q within %v", name, *wait))
				}
				cancelRun()
			}
			mu.Unlock()
		})
		defer t.Stop()
	}

	lead := func(lctx context.Context) error {
		mu.Lock()
		if result != nil { // --wait expired as we were elected
			mu.Unlock()
			return nil
		}
		elected = true
		mu.Unlock()
		term, _ := sovereign.TermFromContext(lctx)
		if lctx.Err() != nil {
			// The term ended before the command could start.
			log.Warn("sovereign: leadership lost before the command started", "election", name, "term", term, "cause", context.Cause(lctx))
			if !*rejoin && runCtx.Err() == nil {
				setResult(exitWith(exitLost, fmt.Errorf("election %q term %d: %v before the command started", name, term, context.Cause(lctx))))
				cancelRun()
			}
			return nil
		}
		c, err := sup.start(hs.spec, childEnv(map[string]string{
			"SOVEREIGN_ELECTION":  name,
			"SOVEREIGN_HOLDER_ID": h.id,
			"SOVEREIGN_TERM":      strconv.FormatUint(term, 10),
		}), func() time.Time { return e.Status().Deadline })
		if errors.Is(err, errSignalled) {
			return nil
		}
		if err != nil {
			setResult(err)
			cancelRun()
			return err
		}
		log.Info("sovereign: leading; command started", "election", name, "term", term, "pid", c.pgid)
		out := supervise(lctx, sup, c)
		if !out.lost {
			log.Info("sovereign: command exited; stepping down", "election", name, "term", term, "status", out.status)
			setResult(exitWith(out.code, nil))
			cancelRun()
			return nil
		}
		if code, ok := sup.signalled(); ok {
			setResult(exitWith(code, nil))
			return nil
		}
		log.Warn("sovereign: leadership lost; command stopped", "election", name, "term", term, "cause", out.cause, "status", out.status)
		if *rejoin {
			return nil
		}
		setResult(exitWith(exitLost, fmt.Errorf("election %q term %d: %v; the command was stopped (%s)", name, term, out.cause, out.status)))
		cancelRun()
		return nil
	}
	if err := e.Run(runCtx, lead); err != nil {
		return exitWith(exitSoftware, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if result != nil {
		return result
	}
	if code, ok := sup.signalled(); ok {
		return exitWith(code, nil)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return exitWith(exitSoftware, errors.New("campaign ended without a result"))
}
