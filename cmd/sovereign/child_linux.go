package main

import (
	"syscall"
)

// sysProcAttr puts the child in a process group of its own and has the
// kernel send it SIGKILL when sovereign dies (PR_SET_PDEATHSIG; the kernel
// ties it to the thread that started the child, and Go never ends its
// threads unless a goroutine locked to one exits, which sovereign never
// does).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// becomeSubreaper makes orphaned descendants of sovereign (the command's
// own children, once the command has exited) its children instead of
// init's, so that sovereign can reap them and know when they are gone.
func becomeSubreaper() error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
