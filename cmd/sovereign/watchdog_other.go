//go:build unix && !linux

package main

import (
	"errors"
	"time"
)

// There is no watchdog on this system (see watchdog_linux.go): a command
// whose sovereign is paused runs on.

type watchdog struct{ sent time.Time }

func watchdogPoll(time.Duration) time.Duration { return time.Second }

func startWatchdog(int, time.Time) (*watchdog, error) {
	return nil, errors.ErrUnsupported
}

func (*watchdog) send(time.Time) error { return nil }
func (*watchdog) hasFired() bool       { return false }
func (*watchdog) close()               {}

func runWatchdogIfAsked() {}
