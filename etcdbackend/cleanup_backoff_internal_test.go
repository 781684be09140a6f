package etcdbackend

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestCleanUpBackoff: background clean-ups that fail together (a store
// outage) try again after capped exponential pauses with jitter: the n-th
// pause lies in [d/2, d] for d = 1 s·2^(n-1) capped at 8 s, and a herd that
// failed at the same instant does not come back at one instant.
func TestCleanUpBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const herd, fails = 200, 8
		start := time.Now()
		tries := make([][]time.Duration, herd)
		var wg sync.WaitGroup
		for i := range herd {
			wg.Go(func() {
				retryCleanUp(t.Context(), func() bool {
					tries[i] = append(tries[i], time.Since(start))
					return len(tries[i]) > fails
				})
			})
		}
		wg.Wait()
		for i, at := range tries {
			if len(at) != fails+1 {
				t.Fatalf("clean-up %d: %d attempts, want %d", i, len(at), fails+1)
			}
			for n := 1; n < len(at); n++ {
				d := min(cleanUpRetry<<(n-1), cleanUpMaxRetry)
				if gap := at[n] - at[n-1]; gap < d/2 || gap > d {
					t.Fatalf("clean-up %d: pause %d of %v, want within [%v, %v]", i, n, gap, d/2, d)
				}
			}
		}
		// The herd's second and last attempts: spread, not at one instant.
		for _, n := range []int{1, fails} {
			at := make([]time.Duration, herd)
			for i := range tries {
				at[i] = tries[i][n]
			}
			slices.Sort(at)
			d := min(cleanUpRetry<<(n-1), cleanUpMaxRetry)
			if spread := at[herd-1] - at[0]; spread < d/4 {
				t.Errorf("attempt %d of the herd: spread over %v, want at least %v", n+1, spread, d/4)
			}
			if same := herd - len(slices.Compact(at)); same > herd/10 {
				t.Errorf("attempt %d of the herd: %d at an instant another had, want at most %d", n+1, same, herd/10)
			}
		}
	})
}

// TestCleanUpBackoffStopsOnClose: a clean-up waiting to try again stops
// when the Backend is closed (its life ends), without another attempt.
func TestCleanUpBackoffStopsOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		life, stop := context.WithCancel(t.Context())
		var tries int
		done := make(chan struct{})
		go func() {
			defer close(done)
			retryCleanUp(life, func() bool {
				tries++
				return false
			})
		}()
		time.Sleep(3 * cleanUpRetry) // fake time: attempts at 0 and within [0.5 s, 1 s] and then [1 s, 2 s] later
		synctest.Wait()
		before := tries
		stop()
		<-done
		if tries != before || tries < 2 {
			t.Errorf("attempts: %d before the close, %d after; want at least 2, and none after", before, tries)
		}
	})
}
