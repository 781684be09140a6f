package lock_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestWarnsWhenARenewalCannotBeRetried: lock.New warns when a renewal
// that times out could not be retried before the renew deadline
// (RenewInterval*5/4 at or past RenewDeadline), and only then.
func TestWarnsWhenARenewalCannotBeRetried(t *testing.T) {
	for _, c := range []struct {
		name string
		opts lock.Options
		warn bool
	}{
		{"defaults", lock.Options{}, false},
		{"RenewInterval TTL/2", lock.Options{TTL: 2 * time.Second, RenewInterval: time.Second}, false},
		{"RequestTimeout 5s at TTL 10s", lock.Options{RequestTimeout: 5 * time.Second}, false},
		{"RenewInterval 0.55 TTL", lock.Options{TTL: 2 * time.Second, RenewInterval: 1100 * time.Millisecond}, false},
		{"RenewInterval 0.56 TTL", lock.Options{TTL: 2 * time.Second, RenewInterval: 1120 * time.Millisecond}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			o := c.opts
			o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
			b := memorybackend.New()
			defer b.Close()
			l, err := lock.New(b, "me", &o)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got := strings.Count(buf.String(), "a renewal that times out is not retried")
			if (got == 1) != c.warn || got > 1 {
				t.Errorf("warnings: got %d, want %v; log:\n%s", got, c.warn, buf.String())
			}
		})
	}
}
