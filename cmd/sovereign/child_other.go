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

// reapGroup reaps every exited process of process group pgid that is a
// child of sovereign, without blocking.
func reapGroup(pgid int) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-pgid, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}
