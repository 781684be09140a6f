package chaos_test

import (
	"context"
	"testing"

	"github.com/sovereign-go/sovereign/internal/chaos"
)

func TestStoreFences(t *testing.T) {
	s, err := chaos.NewStore()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := chaos.NewStoreClient(s.URL())
	defer c.Close()
	steps := []struct {
		id         string
		term, seq  uint64
		wantAccept bool
	}{
		{"a", 3, 1, true},
		{"a", 3, 2, true},  // same term again
		{"b", 5, 1, true},  // newer term
		{"a", 3, 3, false}, // stale: fenced
		{"b", 5, 2, true},
		{"c", 4, 1, false}, // newer than a's, older than b's
		{"d", 6, 1, true},
	}
	for _, st := range steps {
		got, err := c.Write(context.Background(), st.id, st.term, st.seq)
		if err != nil || got != st.wantAccept {
			t.Fatalf("write %s term %d seq %d: got %v, %v, want %v, nil", st.id, st.term, st.seq, got, err, st.wantAccept)
		}
	}
	ws := s.Writes()
	if len(ws) != len(steps) {
		t.Fatalf("got %d recorded writes, want %d", len(ws), len(steps))
	}
	for i, w := range ws {
		st := steps[i]
		if w.ID != st.id || w.Term != st.term || w.Seq != st.seq || w.Accepted != st.wantAccept {
			t.Fatalf("write %d: got %+v, want %+v", i, w, st)
		}
		if i > 0 && w.At < ws[i-1].At {
			t.Fatalf("write %d: arrival %d before the previous one's %d", i, w.At, ws[i-1].At)
		}
	}
	last, ok := s.Last()
	if !ok || last.ID != "d" || last.Term != 6 {
		t.Fatalf("Last: got %+v, %v, want d term 6", last, ok)
	}
	// The latest accepted writes, newest first, skipping rejected ones.
	got := s.LastAccepted(3)
	if len(got) != 3 || got[0].ID != "d" || got[1].ID != "b" || got[1].Seq != 2 || got[2].ID != "b" || got[2].Seq != 1 {
		t.Fatalf("LastAccepted(3): got %+v, want d 6/1, b 5/2, b 5/1", got)
	}
	if got := s.LastAccepted(100); len(got) != 5 {
		t.Fatalf("LastAccepted(100): got %d writes, want the 5 accepted", len(got))
	}
}

// TestSemaphoreStoreFences checks the fence of a store for 2 permits: a
// write is accepted while its term is among the 2 highest accepted terms.
func TestSemaphoreStoreFences(t *testing.T) {
	s, err := chaos.NewSemaphoreStore(2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	steps := []struct {
		id         string
		term       uint64
		wantAccept bool
	}{
		{"a", 3, true},
		{"b", 2, true},  // fewer than 2 terms so far: accepted
		{"a", 3, true},  // same term again
		{"b", 2, true},  // still among the 2 highest
		{"c", 5, true},  // newer: 5 and 3 are now the 2 highest
		{"b", 2, false}, // two newer holders wrote: fenced
		{"a", 3, true},
		{"d", 4, true}, // between 3 and 5: 5 and 4 are the 2 highest
		{"a", 3, false},
		{"c", 5, true},
		{"e", 1, false},
	}
	for i, st := range steps {
		if got := s.Write(st.id, st.term, uint64(i+1)); got != st.wantAccept {
			t.Fatalf("step %d: write %s term %d: got accepted %v, want %v", i, st.id, st.term, got, st.wantAccept)
		}
	}
	if _, err := chaos.NewSemaphoreStore(0); err == nil {
		t.Fatal("NewSemaphoreStore(0): got nil error, want one")
	}
}
