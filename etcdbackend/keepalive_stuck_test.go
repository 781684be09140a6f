package etcdbackend_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// stuckKeepAlives makes lease keep-alive streams stop answering, as one does
// whose member hangs (SIGSTOP, a frozen VM) or whose member forwards the
// keep-alives to a raft leader that hangs: etcd answers a stream's requests
// in order, so one reply that does not come holds up every later one.
type stuckKeepAlives struct {
	mu        sync.Mutex
	last      *kaStream // the keep-alive stream opened last
	stickNext bool      // the next stream opened gets stuck
}

// kaStream is a keep-alive stream whose replies stop once it is stuck.
type kaStream struct {
	grpc.ClientStream
	ctx   context.Context
	stuck chan struct{} // closed when the stream gets stuck
}

func (s *kaStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	select {
	case <-s.stuck: // a reply that came after the stream got stuck is dropped
		<-s.ctx.Done() // until the client gives the stream up
		return s.ctx.Err()
	default:
	}
	return err
}

// stick makes the keep-alive stream open now stop answering (the replies
// already on their way included), or the next one opened if none is open.
func (k *stuckKeepAlives) stick() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.last != nil && k.last.ctx.Err() == nil {
		select {
		case <-k.last.stuck:
		default:
			close(k.last.stuck)
			return
		}
	}
	k.stickNext = true
}

func (k *stuckKeepAlives) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
		return cs, err
	}
	s := &kaStream{ClientStream: cs, ctx: ctx, stuck: make(chan struct{})}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.last = s
	if k.stickNext {
		k.stickNext = false
		close(s.stuck)
	}
	return s, nil
}

// TestStuckKeepAliveIsSentAgain: a renewal whose keep-alive gets no reply
// sends a copy on a stream of its own, and another when that one is stuck
// too, so a keep-alive stream that hangs costs half a second, not the lease.
// Before, every keep-alive waited on the stuck stream until the call's
// deadline, and the next ones on the same stream, until the connection under
// it was dropped (10-13 s for a member that hangs) or the follower's forward
// to a raft leader that hangs timed out (7 s): on a three-member etcd 3.4
// cluster whose raft leader member was paused for 15 s, the leader stepped
// down at its renew deadline in 3 runs of 3 (README, "A member that
// hangs"). A stream that is only slow still answers:
// TestSessionCountsFromSendTime renews with replies 1.5 s late.
func TestStuckKeepAliveIsSentAgain(t *testing.T) {
	ec := testetcd.Start(t)
	var k stuckKeepAlives
	cfg := ec.ClientConfig()
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainStreamInterceptor(k.intercept))
	b, err := etcdbackend.New(testetcd.NewClient(t, cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Renew(ctx, l); err != nil { // the keep-alive stream is open now
		t.Fatal(err)
	}
	// An elector's default RequestTimeout (2 s) twice, then the one of a
	// TTL of 2 s (400 ms): its copies go at quarters of its time.
	for i, timeout := range []time.Duration{2 * time.Second, 2 * time.Second, 400 * time.Millisecond} {
		k.stick()
		rctx, cancel := context.WithTimeout(ctx, timeout)
		start := time.Now()
		err := b.Renew(rctx, l)
		cancel()
		if err != nil {
			t.Fatalf("renewal %d on a stuck keep-alive stream: got %v after %v, want nil: a copy of the keep-alive sent on a stream of its own", i+1, err, time.Since(start).Round(time.Millisecond))
		}
		t.Logf("renewal %d on a stuck keep-alive stream succeeded after %v", i+1, time.Since(start).Round(time.Millisecond))
	}
}
