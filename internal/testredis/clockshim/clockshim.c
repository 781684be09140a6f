// A clock shim for tests: LD_PRELOAD it into a process to step its wall
// clock (CLOCK_REALTIME, gettimeofday, time) by the nanoseconds stored in
// the 8-byte file named by SOVEREIGN_CLOCK_OFFSET_FILE, read on every call.
// Other clocks (CLOCK_MONOTONIC...) are untouched, as in an NTP step.
// It calls the kernel directly and allocates nothing, so it cannot recurse
// through a malloc that reads the clock (jemalloc), as libfaketime does.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns;
static volatile int state; /* 0 unset, 1 mapped or absent */

static int64_t offset(void) {
	if (!__atomic_load_n(&state, __ATOMIC_ACQUIRE)) {
		const char *p = getenv("SOVEREIGN_CLOCK_OFFSET_FILE");
		if (p) {
			int fd = (int)syscall(SYS_openat, AT_FDCWD, p, O_RDONLY | O_CLOEXEC);
			if (fd >= 0) {
				void *m = mmap(0, 8, PROT_READ, MAP_SHARED, fd, 0);
				syscall(SYS_close, fd);
				if (m != MAP_FAILED) offset_ns = m;
			}
		}
		__atomic_store_n(&state, 1, __ATOMIC_RELEASE);
	}
	return offset_ns ? __atomic_load_n(offset_ns, __ATOMIC_RELAXED) : 0;
}

static void shift(struct timespec *ts) {
	int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();
	ts->tv_sec = ns / 1000000000;
	ts->tv_nsec = ns % 1000000000;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	int r = (int)syscall(SYS_clock_gettime, id, ts);
	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
	return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	struct timespec ts;
	(void)tz;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
	if (tv) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (t) *t = ts.tv_sec;
	return ts.tv_sec;
}
