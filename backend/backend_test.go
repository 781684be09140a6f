package backend_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// A record printed for a log (%v, %+v, slog) never shows its token.
func TestRecordStringOmitsTheToken(t *testing.T) {
	r := backend.Record{Key: "billing", HolderID: "a", Token: "s3cr3t-token", Term: 7, TTL: 3 * time.Second,
		Metadata: map[string]string{"host": "h1"}}
	for _, got := range []string{fmt.Sprintf("%v", r), fmt.Sprintf("%+v", r), fmt.Sprintf("%+v", struct{ Leader backend.Record }{r})} {
		if strings.Contains(got, "s3cr3t") {
			t.Errorf("printed %q: want no token", got)
		}
		for _, want := range []string{"billing", "a", "7", "3s", "host:h1"} {
			if !strings.Contains(got, want) {
				t.Errorf("printed %q: want it to contain %q", got, want)
			}
		}
	}
	if got := fmt.Sprint(backend.Record{Key: "billing"}); got != "{Key:billing free}" {
		t.Errorf("free record printed %q, want {Key:billing free}", got)
	}
}
