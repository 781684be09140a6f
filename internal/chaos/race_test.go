//go:build race

package chaos_test

// raceEnabled reports whether the test binary runs with the race detector;
// the candidate is then built with it too (its packages are in the build
// cache already, and a race in a candidate fails the run through its exit
// code).
const raceEnabled = true
