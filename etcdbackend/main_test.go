package etcdbackend_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// shared is the one-member etcd server the tests of this package share,
// each under its own prefix. Tests that stop members start their own.
var shared *testetcd.Cluster

// prefixes numbers the prefixes handed out by newPrefix.
var prefixes atomic.Int64

// newPrefix returns a key prefix no other test of this binary uses.
func newPrefix() string { return fmt.Sprintf("test/%d/", prefixes.Add(1)) }

func TestMain(m *testing.M) {
	c, err := testetcd.New(1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared = c
	// The server is stopped before goleak looks for leftover goroutines.
	goleak.VerifyTestMain(stopAfter{m, c}, testetcd.IgnoredGoroutines()...)
}

type stopAfter struct {
	m *testing.M
	c *testetcd.Cluster
}

func (s stopAfter) Run() int {
	defer s.c.Close()
	return s.m.Run()
}

// newClient returns a client of c (or of the shared server when c is nil)
// with extra configuration applied, closed when the test ends.
func newClient(t testing.TB, c *testetcd.Cluster, configure func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	if c == nil {
		c = shared
	}
	cfg := c.ClientConfig()
	if configure != nil {
		configure(&cfg)
	}
	return testetcd.NewClient(t, cfg)
}

// newBackend returns a Backend on cli, closed when the test ends.
func newBackend(t testing.TB, cli *clientv3.Client, opts *etcdbackend.Options) *etcdbackend.Backend {
	t.Helper()
	b, err := etcdbackend.New(cli, opts)
	if err != nil {
		t.Fatalf("New: got error %v, want nil", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
