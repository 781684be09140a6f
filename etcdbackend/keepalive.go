package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// kaStream is the one lease keep-alive stream a Backend keeps open for its
// keep-alives: clientv3's KeepAliveOnce opens a gRPC stream for each one
// (stream set-up on both sides, a server goroutine, teardown), which cost
// the client and the server about three times what the keep-alive itself
// does. etcd answers the requests of one stream one by one, in order, so
// the replies are matched to the requests in the order they were sent.
type kaStream struct {
	mu      sync.Mutex // guards the fields below; held while sending, so sends and queue order agree
	stream  pb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc // ends stream
	waiters []*kaWaiter        // requests sent on stream, awaiting their replies, oldest first
}

// kaHedgeAfter is how long a keep-alive waits for its reply before a copy
// is sent on a stream of its own, and then the next copy, up to kaHedges
// copies (see keepAliveOnce), or a quarter of the call's time when that is
// shorter: a renewal with an elector's default RequestTimeout (2 s) tries
// up to four streams, some of which may go to a member that hangs.
const (
	kaHedgeAfter = 500 * time.Millisecond
	kaHedges     = 3
	// kaHedgeMin bounds the wait before a copy from below, whatever the
	// call's deadline.
	kaHedgeMin = 20 * time.Millisecond
)

// kaWaiter is one keep-alive sent on the stream.
type kaWaiter struct {
	id   clientv3.LeaseID
	done chan struct{} // closed when ttl and err are set
	ttl  int64
	err  error
}

// keepAliveOnce sends one keep-alive of etcd lease id, on the Backend's
// keep-alive stream (opened on first use, and again after it broke), and
// waits for its reply or the end of ctx, returning the lease's TTL. A lease
// etcd no longer has gives an error matching rpctypes.ErrLeaseNotFound, as
// clientv3's KeepAliveOnce does. When the stream cannot be opened it falls
// back to KeepAliveOnce.
//
// A keep-alive still without a reply after kaHedgeAfter is sent again
// through KeepAliveOnce, on a stream of its own, up to kaHedges times, and
// the first reply wins. etcd answers the requests of a stream in order, so
// one that is stuck holds up every later one: a follower forwards
// keep-alives to the raft leader and waits up to its request timeout (7 s
// with etcd's default timing) when that leader hangs (SIGSTOP, a frozen VM,
// a disk stall), and a stream on a member that hangs waits until gRPC's
// keepalive drops the connection (10 to 13 s). Either outlasted a leader's
// renew deadline, although etcd had another raft leader within about a
// second. A stream of its own goes on the client's next connection (its
// balancer is round robin), and once the follower knows the new raft leader
// its forward goes there. The keep-alive stream is kept: a slow one still
// answers. A keep-alive is idempotent, so sending one twice is harmless.
func (b *Backend) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) (ttl int64, err error) {
	w, err := b.sendKeepAlive(ctx, id)
	if err != nil {
		resp, err := b.cli.KeepAliveOnce(ctx, id)
		if err != nil {
			return 0, err
		}
		return resp.TTL, nil
	}
	hctx, cancel := context.WithCancel(ctx)
	var hedges sync.WaitGroup
	defer func() {
		cancel()
		hedges.Wait()
	}()
	type result struct {
		ttl int64
		err error
	}
	hedged := make(chan result, kaHedges)
	// A call with less time than that (a short TTL's RequestTimeout) sends
	// its copies at quarters of its time, so that they can still answer.
	after := kaHedgeAfter
	if dl, ok := ctx.Deadline(); ok {
		after = max(min(after, time.Until(dl)/(kaHedges+1)), kaHedgeMin)
	}
	t := time.NewTimer(after)
	defer t.Stop()
	for sent := 0; ; {
		select {
		case <-w.done:
			switch {
			case w.err != nil:
				return 0, clientv3.ContextError(ctx, w.err)
			case w.ttl <= 0:
				return 0, rpctypes.ErrLeaseNotFound
			}
			return w.ttl, nil
		case r := <-hedged:
			if r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound) {
				return r.ttl, r.err
			}
			// Keep waiting for the stream and the other copies.
		case <-ctx.Done():
			// The reply, when it comes, is read and dropped by the reader.
			return 0, ctx.Err()
		case <-t.C:
			sent++
			hedges.Go(func() {
				resp, err := b.cli.KeepAliveOnce(hctx, id)
				if err != nil {
					hedged <- result{err: err}
					return
				}
				hedged <- result{ttl: resp.TTL}
			})
			if sent < kaHedges {
				t.Reset(after)
			}
		}
	}
}

// sendKeepAlive sends a keep-alive of id on the stream, opening the stream
// first if there is none, and returns its waiter.
func (b *Backend) sendKeepAlive(ctx context.Context, id clientv3.LeaseID) (*kaWaiter, error) {
	ks := &b.ka
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.stream == nil {
		if err := b.openKeepAliveLocked(ctx); err != nil {
			return nil, err
		}
	}
	w := &kaWaiter{id: id, done: make(chan struct{})}
	if err := ks.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
		// The reader sees the stream fail too, and fails the waiters.
		ks.closeLocked(err)
		return nil, err
	}
	ks.waiters = append(ks.waiters, w)
	return w, nil
}

// openKeepAliveLocked opens the keep-alive stream and starts its reader. The
// stream lives until the Backend is closed or it breaks; opening it is
// bounded by ctx (and by the request timeout). It runs with b.ka.mu held.
func (b *Backend) openKeepAliveLocked(ctx context.Context) error {
	if !b.track() {
		return errors.New("backend closed")
	}
	sctx, cancel := context.WithCancel(b.life)
	// Opening waits for a connection: bound it by ctx, not the stream's
	// lifetime.
	stop := context.AfterFunc(ctx, cancel)
	stream, err := pb.NewLeaseClient(b.cli.ActiveConnection()).LeaseKeepAlive(sctx)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		cancel()
		b.watches.Done()
		return fmt.Errorf("open keep-alive stream: %w", err)
	}
	ks := &b.ka
	ks.stream, ks.cancel = stream, cancel
	go func() {
		defer b.watches.Done()
		b.readKeepAlives(stream)
	}()
	return nil
}

// readKeepAlives delivers the replies of stream to their waiters until the
// stream fails (it is closed by Close, the client or the server), then
// fails the waiters left.
func (b *Backend) readKeepAlives(stream pb.Lease_LeaseKeepAliveClient) {
	ks := &b.ka
	for {
		resp, err := stream.Recv()
		ks.mu.Lock()
		if ks.stream != stream {
			ks.mu.Unlock()
			return // replaced after it failed: its waiters were failed then
		}
		if err == nil && (len(ks.waiters) == 0 || ks.waiters[0].id != clientv3.LeaseID(resp.ID)) {
			err = fmt.Errorf("keep-alive reply for lease %x out of order", resp.ID)
		}
		if err != nil {
			ks.closeLocked(err)
			ks.mu.Unlock()
			return
		}
		w := ks.waiters[0]
		ks.waiters[0] = nil
		ks.waiters = ks.waiters[1:]
		ks.mu.Unlock()
		w.ttl = resp.TTL
		close(w.done)
	}
}

// closeLocked ends the stream and fails every waiter with err; the next
// keep-alive opens a new stream. It runs with ks.mu held.
func (ks *kaStream) closeLocked(err error) {
	if ks.stream == nil {
		return
	}
	ks.cancel()
	ks.stream, ks.cancel = nil, nil
	for _, w := range ks.waiters {
		w.err = err
		close(w.done)
	}
	ks.waiters = nil
}
