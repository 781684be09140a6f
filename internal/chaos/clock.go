package chaos

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Now returns the machine's CLOCK_MONOTONIC reading in nanoseconds. Unlike
// the monotonic reading inside a time.Time, which counts from the start of
// its own process, it is the same clock in every process on the machine, so
// the logs of several processes can be laid on one time line. It is also the
// clock Go's runtime reads for timers and time.Now on Linux, so the
// deadlines the elector keeps and the timestamps taken here agree.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("chaos: clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}
