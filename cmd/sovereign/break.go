package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

func cmdBreak(ctx context.Context, env *env, args []string) error {
	fs := newFlagSet(env, "break", "break [--lock] KEY --term N")
	term := fs.Uint64("term", 0, "the fencing term of the lease to release (required; see status)")
	isLock := keyFlag(fs)
	pos, err := exactArgs(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *term == 0 {
		return usageError("--term N is required: the term shown by status, so that only that lease is released, never a newer one")
	}
	b, key, err := env.openKey(pos[0], *isLock)
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Fprintf(env.stderr, `
WARNING: break releases a lease its holder still believes it holds.
WARNING: this BREAKS MUTUAL EXCLUSION unless the holder is dead: if it is
WARNING: alive, it keeps working until its renew deadline while a successor
WARNING: may already start. Only writes that check the fencing term are safe.

`)
	ctx, cancel := context.WithTimeout(ctx, env.backend.commandTimeout)
	defer cancel()
	rec, err := b.Get(ctx, key)
	if errors.Is(err, backend.ErrNotHeld) {
		return exitWith(exitFree, fmt.Errorf("%q is not held: nothing to break", key))
	}
	if err != nil {
		return unreachable(err)
	}
	if rec.Term != *term {
		return exitWith(exitFree, fmt.Errorf("%q is held by %q under term %d, not term %d: refusing to break another lease", key, rec.HolderID, rec.Term, *term))
	}
	ttl := rec.TTL
	if ttl <= 0 {
		ttl = time.Millisecond // Release checks only that it is positive
	}
	err = b.Release(ctx, backend.Lease{Key: key, HolderID: rec.HolderID, Token: rec.Token, Term: rec.Term, TTL: ttl})
	if errors.Is(err, backend.ErrLeaseLost) {
		return exitWith(exitFree, fmt.Errorf("the lease of %q term %d ended before it could be broken: nothing released", key, *term))
	}
	if err != nil {
		return unreachable(err)
	}
	fmt.Fprintf(env.stdout, "released %q: holder %q, term %d\n", key, rec.HolderID, rec.Term)
	return nil
}
