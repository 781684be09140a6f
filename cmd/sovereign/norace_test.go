//go:build !race

package main

// raceEnabled says whether the tests run with the race detector, so the
// binary under test is built with it too.
const raceEnabled = false
