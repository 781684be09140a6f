package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// keyFlag adds --lock, which turns a lock key into its backend key.
func keyFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("lock", false, "NAME is a lock key (backend key lock/NAME), not an election")
}

func backendKey(name string, isLock bool) string {
	if isLock {
		return lockPrefix + name
	}
	return name
}

// openKey opens the backend and returns it with the backend key of name
// (see backendKey), which the backend has checked: an invalid key is a
// usage error. On success the caller closes the backend.
func (e *env) openKey(name string, isLock bool) (*opened, string, error) {
	b, err := e.open()
	if err != nil {
		return nil, "", err
	}
	key := backendKey(name, isLock)
	if err := b.ValidateKey(key); err != nil {
		b.Close()
		return nil, "", exitWith(exitUsage, err)
	}
	return b, key, nil
}

// outputFlag adds -o text|json.
func outputFlag(fs *flag.FlagSet) *string {
	return fs.String("o", "text", "output `format`: text or json")
}

func checkOutput(o string) error {
	if o != "text" && o != "json" {
		return usageError("-o %q: want text or json", o)
	}
	return nil
}

// readNamed parses the flags and the one argument NAME of status and members
// (out and isLock are the flags' values, read once parsed), opens the
// backend and reads NAME's entry (lock key NAME with --lock).
func readNamed(ctx context.Context, env *env, fs *flag.FlagSet, out *string, isLock *bool, args []string) (entry, error) {
	pos, err := exactArgs(fs, args, 1, 1)
	if err != nil {
		return entry{}, err
	}
	if err := checkOutput(*out); err != nil {
		return entry{}, err
	}
	b, key, err := env.openKey(pos[0], *isLock)
	if err != nil {
		return entry{}, err
	}
	defer b.Close()
	e, err := readEntry(ctx, b, key, env.backend.commandTimeout)
	if err != nil {
		return entry{}, unreachable(err)
	}
	if !*isLock && !e.Held && *out == "text" {
		// A lock looked for as an election (without --lock)? Say so; the
		// output and exit status stay those of the election.
		lk := backendKey(pos[0], true)
		if b.ValidateKey(lk) == nil {
			if le, err := readEntry(ctx, b, lk, env.backend.commandTimeout); err == nil && le.Held {
				fmt.Fprintf(env.stderr, "sovereign: no election %q is held, but a lock of that name is (holder %q): %s --lock %s\n",
					pos[0], le.Holder, fs.Name(), pos[0])
			}
		}
	}
	return e, nil
}

// writeJSON writes v to standard output as indented JSON.
func writeJSON(env *env, v any) error {
	enc := json.NewEncoder(env.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdStatus(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "status", "status [-o json] [--exit-status] [--lock] NAME")
	out := outputFlag(fs)
	exitStatus := fs.Bool("exit-status", false, "exit 0 when NAME is held, 3 when nobody holds it")
	isLock := keyFlag(fs)
	e, err := readNamed(ctx, env, fs, out, isLock, args)
	if err != nil {
		return err
	}
	if *out == "json" {
		if err := writeJSON(env, e); err != nil {
			return err
		}
	} else {
		writeStatus(env.stdout, e, time.Now())
	}
	if *exitStatus && !e.Held {
		return exitWith(exitFree, nil)
	}
	return nil
}

func cmdMembers(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "members", "members [-o json] [--lock] NAME")
	out := outputFlag(fs)
	isLock := keyFlag(fs)
	e, err := readNamed(ctx, env, fs, out, isLock, args)
	if err != nil {
		return err
	}
	if *out == "json" {
		return writeJSON(env, e.Members)
	}
	t := &table{}
	t.row("ID", "HEARTBEAT", "EXPIRES IN", "")
	for _, m := range e.Members {
		role := ""
		if m.Holder {
			role = "holder"
		}
		t.row(m.ID, round(secs(m.AgeSeconds)).String()+" ago", round(secs(m.TTLSeconds)).String(), role)
	}
	t.write(env.stdout)
	return nil
}

func cmdList(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "list", "list [-o json] [PREFIX]")
	out := outputFlag(fs)
	pos, err := exactArgs(fs, args, 0, 1)
	if err != nil {
		return err
	}
	if err := checkOutput(*out); err != nil {
		return err
	}
	prefix := ""
	if len(pos) == 1 {
		prefix = pos[0]
	}
	b, err := env.open()
	if err != nil {
		return err
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(ctx, env.backend.commandTimeout)
	defer cancel()
	recs, err := listBoth(ctx, b, prefix)
	if err != nil {
		return unreachable(err)
	}
	entries := make([]entry, 0, len(recs))
	for i := range recs {
		entries = append(entries, newEntry(recs[i].Key, &recs[i], nil))
	}
	if *out == "json" {
		return writeJSON(env, entries)
	}
	t := &table{}
	t.row("KIND", "NAME", "HOLDER", "TERM", "MODE", "TTL", "SINCE")
	for _, e := range entries {
		since := ""
		if e.Since != nil {
			since = e.Since.Format(time.RFC3339)
		}
		mode := e.Mode
		if e.Kind != "lock" {
			mode = "" // an election has one holder
		}
		if e.Limit > 0 {
			mode += fmt.Sprintf("/%d", e.Limit)
		}
		t.row(e.Kind, e.Name, e.Holder, fmt.Sprint(e.Term), mode, round(secs(e.TTLSeconds)).String(), since)
	}
	t.write(env.stdout)
	return nil
}

// listBoth lists the elections beginning with prefix and the locks whose
// key begins with prefix (backend keys lock/PREFIX...), sorted by key.
func listBoth(ctx context.Context, b backend.Backend, prefix string) ([]backend.Record, error) {
	recs, err := b.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	if prefix == "" || hasLockPrefix(prefix) {
		return recs, nil
	}
	locks, err := b.List(ctx, lockPrefix+prefix)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(recs))
	for _, r := range recs {
		seen[r.Key] = true
	}
	for _, r := range locks {
		if !seen[r.Key] {
			recs = append(recs, r)
		}
	}
	// Stable: a key's Shared holders stay in term order.
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
	return recs, nil
}

// hasLockPrefix reports whether listing prefix p already includes the lock
// keys that begin with it: p begins with "lock/", or "lock/" begins with p.
func hasLockPrefix(p string) bool {
	return strings.HasPrefix(p, lockPrefix) || strings.HasPrefix(lockPrefix, p)
}

func cmdWatch(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "watch", "watch [-o json] [--interval D] [--lock] NAME")
	out := outputFlag(fs)
	interval := fs.Duration("interval", time.Second, "re-read at least this often (changes the backend reports arrive at once)")
	isLock := keyFlag(fs)
	pos, err := exactArgs(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if err := checkOutput(*out); err != nil {
		return err
	}
	if *interval <= 0 {
		return usageError("--interval must be positive")
	}
	b, key, err := env.openKey(pos[0], *isLock)
	if err != nil {
		return err
	}
	defer b.Close()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	wake := make(chan struct{}, 1)
	if w, ok := b.Backend.(backend.Watcher); ok {
		go watchLoop(ctx, w, key, wake)
	}
	enc := json.NewEncoder(env.stdout)
	var (
		last      *entry
		failing   bool
		nextRead  = time.NewTimer(0)
		readAfter = *interval
	)
	defer nextRead.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-nextRead.C:
		}
		rctx, cancel := context.WithTimeout(ctx, env.backend.commandTimeout)
		rec, err := b.Get(rctx, key)
		cancel()
		now := time.Now()
		readAfter = *interval
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !errors.Is(err, backend.ErrNotHeld):
			if !failing {
				fmt.Fprintf(env.stderr, "%s %s: backend unreachable: %v\n", now.Format(time.RFC3339Nano), pos[0], err)
				failing = true
			}
		default:
			failing = false
			var e entry
			if err == nil {
				e = newEntry(key, &rec, nil)
				// Look again right after the lease would expire, in case
				// the backend does not report expiry.
				readAfter = min(readAfter, rec.TTL+10*time.Millisecond)
			} else {
				e = newEntry(key, nil, nil)
			}
			if last == nil || last.Held != e.Held || last.Holder != e.Holder || last.Term != e.Term {
				if *out == "json" {
					_ = enc.Encode(struct {
						Time time.Time `json:"time"`
						entry
					}{now, e})
				} else if e.Held {
					fmt.Fprintf(env.stdout, "%s %s leader %s term %d\n", now.Format(time.RFC3339Nano), e.Name, e.Holder, e.Term)
				} else {
					fmt.Fprintf(env.stdout, "%s %s no leader\n", now.Format(time.RFC3339Nano), e.Name)
				}
				last = &e
			}
		}
		nextRead.Reset(readAfter)
	}
}

// watchLoop keeps a watch on key and signals wake on every event, once
// each time the watch is established, and when it breaks (after which it
// watches again).
func watchLoop(ctx context.Context, w backend.Watcher, key string, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		ch, err := w.Watch(ctx, key)
		if err != nil {
			if errors.Is(err, errors.ErrUnsupported) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		// Read once more now that the subscription is established: a change
		// made between the caller's last read and the subscription would
		// otherwise wait for the next poll.
		signal()
		for range ch {
			signal()
		}
		signal() // the watch broke: changes may have been missed
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
