package memorybackend_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		store := memorybackend.NewStore()
		return backendtest.Env{
			Open:     func() backend.Backend { return store.Client() },
			ShortTTL: 300 * time.Millisecond,
			Size:     store.Len, // Retention zero: terms come from a store-wide counter
			Restart: func(loseData bool) {
				store.Restart(&memorybackend.RestartOptions{KeepLeases: !loseData})
			},
			TermsSurviveDataLoss: true, // the counter survives unless LoseTerms
		}
	})
}
