package etcdbackend_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		prefix := newPrefix()
		return backendtest.Env{
			Open: func() backend.Backend {
				b, err := etcdbackend.New(newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return b
			},
			// Whole seconds; 2s so that a lease read just after a renewal
			// still shows a remaining TTL of at least one second.
			ShortTTL: 2 * time.Second,
		}
	})
}
