//go:build unix && !linux

package main

import "syscall"

// sysProcAttr puts the child in a process group of its own. There is no
// parent-death signal on this system: if sovereign is killed with SIGKILL,
// the command keeps running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// becomeSubreaper does nothing on this system: orphaned descendants go to
// init, which reaps them.
func becomeSubreaper() error { return nil }
