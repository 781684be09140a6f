package etcdbackend

import (
	"testing"

	"google.golang.org/grpc/connectivity"
)

// TestConnMonitor: the connection's start, whatever states it goes
// through before it is first ready, is no reconnection; becoming ready
// again after it was ready and then not is one, each time.
func TestConnMonitor(t *testing.T) {
	const (
		idle  = connectivity.Idle
		conn  = connectivity.Connecting
		ready = connectivity.Ready
		fail  = connectivity.TransientFailure
	)
	for _, c := range []struct {
		name   string
		states []connectivity.State
		want   int // reconnections
	}{
		{"start", []connectivity.State{idle, conn, ready}, 0},
		{"start seen connecting", []connectivity.State{conn, ready}, 0},
		{"start after failures", []connectivity.State{conn, fail, conn, fail, conn, ready}, 0},
		{"ready from the start", []connectivity.State{ready}, 0},
		{"reconnection", []connectivity.State{ready, conn, ready}, 1},
		{"reconnection through idle", []connectivity.State{idle, conn, ready, idle, conn, ready}, 1},
		{"reconnection through a failure", []connectivity.State{conn, ready, fail, conn, ready}, 1},
		{"two reconnections", []connectivity.State{ready, fail, ready, conn, ready}, 2},
	} {
		var m connMonitor
		got := 0
		for _, s := range c.states {
			if m.next(s) {
				got++
			}
		}
		if got != c.want {
			t.Errorf("%s %v: got %d reconnections, want %d", c.name, c.states, got, c.want)
		}
	}
}
