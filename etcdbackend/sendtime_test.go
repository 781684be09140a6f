package etcdbackend_test

import (
	"context"
	"path"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// lateReplies delays, while its flags are set, the replies of lease grants
// and of lease keep-alives that a client receives: the request reaches the
// server at once, its reply comes lag later, as over a slow link.
type lateReplies struct {
	lag         time.Duration
	grants, kas atomic.Bool
}

// configure adds the delaying interceptors to cfg.
func (d *lateReplies) configure(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions,
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if path.Base(method) == "LeaseGrant" && d.grants.Load() {
				time.Sleep(d.lag) // latency injected, not synchronisation
			}
			return err
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || path.Base(method) != "LeaseKeepAlive" {
				return s, err
			}
			return &lateRecv{ClientStream: s, d: d}, nil
		}),
	)
}

// lateRecv delays each message received on a keep-alive stream while
// lateReplies.kas is set.
type lateRecv struct {
	grpc.ClientStream
	d *lateReplies
}

func (s *lateRecv) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.d.kas.Load() {
		time.Sleep(s.d.lag) // latency injected, not synchronisation
	}
	return err
}

// TestSessionCountsFromSendTime: what a session lease has left is counted
// from the send time of its grant or last keep-alive, not from the arrival
// of its reply (the server starts the lease's TTL when it gets the
// request). With replies that come late by more than the session's
// headroom, the next acquisition of the TTL must therefore send a
// keep-alive with its transaction, or its key could end before the TTL
// asked for has passed since its send time: after a slow grant, after a
// slow keep-alive of Renew, and after a slow keep-alive sent with an
// acquisition. (Mutations recording the reply's arrival instead, in each of
// the three places, survived every test.) Correct code sends the
// keep-alive however slow the machine: a later reply or a slower step only
// leaves the session less.
func TestSessionCountsFromSendTime(t *testing.T) {
	ctx := testCtx(t)
	const ttl = 8 * time.Second // a session of 9 s: 1 s of headroom
	headroom := etcdbackend.SessionHeadroom(ttl)
	late := &lateReplies{lag: headroom + 500*time.Millisecond}
	var n counter
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		n.configure(cfg)
		late.configure(cfg)
	})
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	acquire := func(key string) backend.Lease {
		t.Helper()
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: ttl})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		return l
	}
	keepAlives := func(what string, want int64) {
		t.Helper()
		if got := n.byMethod()["LeaseKeepAlive"]; got != want {
			t.Errorf("%s: %d keep-alives sent, want %d", what, got, want)
		}
	}

	// A grant whose reply came late: the session has less than ttl left.
	// (The first acquisition was sent before the grant: it lasts the
	// session's TTL from its own send time without a keep-alive.)
	late.grants.Store(true)
	a := acquire("a")
	late.grants.Store(false)
	n.reset()
	acquire("a2")
	keepAlives("an acquisition after a grant answered late", 1)

	// A keep-alive of Renew whose reply came late.
	etcdbackend.AgeSessions(b, 5*time.Second)
	late.kas.Store(true)
	if err := b.Renew(ctx, a); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	late.kas.Store(false)
	n.reset()
	acquire("b")
	keepAlives("an acquisition after a Renew whose keep-alive was answered late", 1)

	// A keep-alive sent with an acquisition, whose reply came late.
	etcdbackend.AgeSessions(b, 5*time.Second)
	late.kas.Store(true)
	acquire("c")
	late.kas.Store(false)
	n.reset()
	acquire("d")
	keepAlives("an acquisition after one whose keep-alive was answered late", 1)
}
