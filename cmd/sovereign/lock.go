package main

import (
	"context"
	"errors"
)

func cmdLock(ctx context.Context, env *env, args []string) error {
	return exitWith(exitSoftware, errors.New("lock: not implemented yet"))
}
