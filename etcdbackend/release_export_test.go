package etcdbackend

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
)

// ReleaseTwoComparisons releases lease l, on a session, with the
// transaction of Release (tokenCheck's two comparisons and the delete), for BenchmarkReleaseComparisons. It reports whether the
// record was deleted.
func (b *Backend) ReleaseTwoComparisons(ctx context.Context, l backend.Lease) (bool, error) {
	resp, err := b.txn(ctx, &pb.TxnRequest{
		Compare: b.tokenCheck(l),
		Success: []*pb.RequestOp{deleteOp(b.leaseKey(l.Key))},
	})
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// ReleaseOneComparison releases lease l, on a session, with ownedTxn's
// first comparison alone and no failure branch, for
// BenchmarkReleaseComparisons.
func (b *Backend) ReleaseOneComparison(ctx context.Context, l backend.Lease) (bool, error) {
	r := b.ownedTxn(l, []*pb.RequestOp{deleteOp(b.leaseKey(l.Key))})
	r.Failure = nil
	resp, err := b.txn(ctx, r)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// ReleaseNested releases lease l, on a session, with ownedTxn's
// transaction (one comparison, tokenCheck nested in the failure branch),
// for BenchmarkReleaseComparisons.
func (b *Backend) ReleaseNested(ctx context.Context, l backend.Lease) (bool, error) {
	resp, err := b.txn(ctx, b.ownedTxn(l, []*pb.RequestOp{deleteOp(b.leaseKey(l.Key))}))
	if err != nil {
		return false, err
	}
	return ownedTxnDone(resp), nil
}

// CheckOwned runs a read-only owner check of lease l, on a session:
// ownedCheck's one comparison (with the read of the record in its failure
// branch) if one, else tokenCheck's two comparisons, for
// BenchmarkRenewCheckComparisons. It reports whether l is held.
func (b *Backend) CheckOwned(ctx context.Context, l backend.Lease, one bool) (bool, error) {
	if !one {
		resp, err := b.txn(ctx, &pb.TxnRequest{Compare: b.tokenCheck(l)})
		if err != nil {
			return false, err
		}
		return resp.Succeeded, nil
	}
	resp, err := b.txn(ctx, b.ownedCheck(l))
	if err != nil {
		return false, err
	}
	return b.ownedCheckHolds(l, resp), nil
}

// ownedTxn, ownedTxnDone, ownedCheck and ownedCheckHolds are an owner check
// of a lease on a session with one comparison instead of tokenCheck's two,
// measured by BenchmarkReleaseComparisons and
// BenchmarkRenewCheckComparisons and not used by the Backend: it was not
// cheaper (see those benchmarks).

// ownedTxn returns a transaction that runs ops if the store holds exactly
// lease l (on a session): if the record of l's key is exactly the one l's
// acquisition wrote without metadata (one comparison: the value, which
// starts with l's token and holder ID), and otherwise, in a transaction
// nested in the failure branch, if the record starts with l's header
// (tokenCheck: two comparisons). A value equal to the plain record starts
// with the header, so ops run exactly when tokenCheck holds, as in a
// transaction with tokenCheck alone; but each comparison costs the server
// a read of the key, and the common case (a lease without metadata) costs
// one instead of two. A lease with metadata, or whose record SetMetadata
// rewrote, costs three. ownedTxnDone tells whether ops ran.
func (b *Backend) ownedTxn(l backend.Lease, ops []*pb.RequestOp) *pb.TxnRequest {
	at, ok := parseTokenTime(l.Token)
	if !ok {
		return &pb.TxnRequest{Compare: b.tokenCheck(l), Success: ops}
	}
	v, err := appendRecord(nil, l.Token, l.HolderID, recordBody{AcquiredAt: at})
	if err != nil {
		return &pb.TxnRequest{Compare: b.tokenCheck(l), Success: ops}
	}
	return &pb.TxnRequest{
		Compare: []*pb.Compare{{Result: pb.Compare_EQUAL, Target: pb.Compare_VALUE, Key: []byte(b.leaseKey(l.Key)), TargetUnion: &pb.Compare_Value{Value: v}}},
		Success: ops,
		Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
			Compare: b.tokenCheck(l),
			Success: ops,
		}}}},
	}
}

// ownedTxnDone reports whether the ops of a transaction from ownedTxn ran:
// by its own comparison, or by the one nested in its failure branch.
func ownedTxnDone(resp *clientv3.TxnResponse) bool {
	if resp.Succeeded {
		return true
	}
	if len(resp.Responses) != 1 {
		return false
	}
	t := resp.Responses[0].GetResponseTxn()
	return t != nil && t.Succeeded
}

// ownedCheck returns a read-only transaction that tells whether the store
// holds exactly lease l (on a session), for ownedCheckHolds: its one
// comparison holds if the record of l's key is exactly the one l's
// acquisition wrote without metadata (as in ownedTxn), and its failure
// branch reads the record, which holds l when it starts with l's header
// (tokenCheck). Nesting tokenCheck, as ownedTxn does, would make the
// transaction one that etcd does not serve as read-only.
func (b *Backend) ownedCheck(l backend.Lease) *pb.TxnRequest {
	at, ok := parseTokenTime(l.Token)
	if !ok {
		return &pb.TxnRequest{Compare: b.tokenCheck(l)}
	}
	v, err := appendRecord(nil, l.Token, l.HolderID, recordBody{AcquiredAt: at})
	if err != nil {
		return &pb.TxnRequest{Compare: b.tokenCheck(l)}
	}
	k := []byte(b.leaseKey(l.Key))
	return &pb.TxnRequest{
		Compare: []*pb.Compare{{Result: pb.Compare_EQUAL, Target: pb.Compare_VALUE, Key: k, TargetUnion: &pb.Compare_Value{Value: v}}},
		Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: k}}}},
	}
}

// ownedCheckHolds reports whether resp, the response to ownedCheck(l),
// says the store holds exactly l: its comparison held, or the record it
// read starts with l's header.
func (b *Backend) ownedCheckHolds(l backend.Lease, resp *clientv3.TxnResponse) bool {
	if resp.Succeeded {
		return true
	}
	if len(resp.Responses) != 1 {
		return false
	}
	r := resp.Responses[0].GetResponseRange()
	if r == nil || len(r.Kvs) != 1 {
		return false
	}
	v := r.Kvs[0].Value
	h := recordHeader(l.Token, l.HolderID)
	return len(v) > len(h) && string(v[:len(h)]) == h
}
