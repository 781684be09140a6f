package keeper

import "time"

// SetWallClock replaces the wall clock for a test and returns a function
// that restores it.
func SetWallClock(f func() time.Time) (restore func()) {
	old := wallNow
	wallNow = f
	return func() { wallNow = old }
}
