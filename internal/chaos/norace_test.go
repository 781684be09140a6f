//go:build !race

package chaos_test

// raceEnabled reports whether the test binary runs with the race detector.
const raceEnabled = false
