package backend_test

import (
	"testing"

	"github.com/sovereign-go/sovereign/backend"
)

// TestMute: the zero Mute is clear; Store calls the registered functions
// once per change, not when the value stays, and a function unregistered
// is not called again; Load tells the value the functions see.
func TestMute(t *testing.T) {
	var m backend.Mute
	if m.Load() {
		t.Fatal("the zero Mute is set, want clear")
	}
	var seen []bool
	cancel := m.OnChange(func() { seen = append(seen, m.Load()) })
	other := 0
	cancelOther := m.OnChange(func() { other++ })
	m.Store(false) // no change
	m.Store(true)
	m.Store(true) // no change
	m.Store(false)
	if len(seen) != 2 || !seen[0] || seen[1] {
		t.Errorf("the hook saw %v, want [true false]", seen)
	}
	if other != 2 {
		t.Errorf("the second hook was called %d times, want 2", other)
	}
	cancel()
	m.Store(true)
	if len(seen) != 2 {
		t.Errorf("a cancelled hook was called: saw %v", seen)
	}
	if other != 3 {
		t.Errorf("the second hook was called %d times, want 3", other)
	}
	cancelOther()
	if !m.Load() {
		t.Error("Load after Store(true): false")
	}
}
