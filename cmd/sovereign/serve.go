package main

import (
	"context"
	"errors"
)

func cmdServe(ctx context.Context, env *env, args []string) error {
	return exitWith(exitSoftware, errors.New("serve: not implemented yet"))
}
