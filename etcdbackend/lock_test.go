package etcdbackend_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/lock/locktest"
)

// TestLocks runs package lock's behaviour over the shared embedded etcd.
func TestLocks(t *testing.T) {
	prefix := newPrefix()
	locktest.Run(t, func(t *testing.T) backend.Backend {
		return newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	}, 2*time.Second)
}
