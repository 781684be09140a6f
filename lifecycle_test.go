package sovereign_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// The errors of calls made out of turn, as the method docs promise: Resign
// before Start is ErrNotLeader; Run without a function is ErrInvalidOptions;
// Start or Run of an elector that already runs is ErrStarted, and leaves the
// running one alone.
func TestCallsOutOfTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := memorybackend.NewStore().Client()
		defer cl.Close()
		e, err := sovereign.New(cl, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Resign(t.Context()); !errors.Is(err, sovereign.ErrNotLeader) {
			t.Errorf("Resign before Start: got %v, want ErrNotLeader", err)
		}
		// Bounded, so that a Run that accepts the nil function returns.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := e.Run(ctx, nil); !errors.Is(err, sovereign.ErrInvalidOptions) {
			t.Fatalf("Run with a nil function: got %v, want ErrInvalidOptions", err)
		}
		if err := e.Start(t.Context()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := e.Start(t.Context()); !errors.Is(err, sovereign.ErrStarted) {
			t.Errorf("second Start: got %v, want ErrStarted", err)
		}
		called := make(chan struct{}, 1)
		if err := e.Run(t.Context(), func(context.Context) error { called <- struct{}{}; return nil }); !errors.Is(err, sovereign.ErrStarted) {
			t.Errorf("Run after Start: got %v, want ErrStarted", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !e.IsLeader() {
			t.Error("the started elector does not lead after the refused calls")
		}
		select {
		case <-called:
			t.Error("the function of a refused Run was called")
		default:
		}
	})
}
