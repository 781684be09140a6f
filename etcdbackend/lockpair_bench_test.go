package etcdbackend_test

import (
	"fmt"
	"testing"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/lock/locktest"
)

// BenchmarkLockPairDiff measures what package lock adds to the wall time
// and the CPU of a TryAcquire + Release pair on the embedded etcd, with 1
// and 16 goroutines, against the backend's Acquire + Release alone
// (locktest.PairDiff; CPU is the process's, the embedded server's too).
//
//	go test -run '^$' -bench BenchmarkLockPairDiff -benchtime 5000x ./etcdbackend
func BenchmarkLockPairDiff(b *testing.B) {
	newB := func(b *testing.B) backend.Backend {
		return newBackend(b, newClient(b, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	}
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) { locktest.PairDiff(b, g, newB(b), newB(b)) })
	}
}
