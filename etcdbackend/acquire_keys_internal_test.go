package etcdbackend

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sovereign-go/sovereign/backend"
)

// TestAcquireKeys: the comparisons and reads of an acquisition built in
// one buffer (acquireKeys), and the delete of a Release on a session that
// reuses tokenCheck's key, are the messages built from strings, key by key.
func TestAcquireKeys(t *testing.T) {
	b := &Backend{prefix: "sovereign/"}
	for _, key := range []string{"k", "lock/a/b:c", "ünï/cödé", "x\xff"} {
		k := b.acquireKeys(key)
		base := b.entryBase(key)
		hb := b.heartbeatPrefix(key)
		want := &pb.TxnRequest{
			Compare: []*pb.Compare{
				createIs(b.leaseKey(key), "", 0),
				createIs(base+holdersPart, base+"j", 0),
			},
			Failure: []*pb.RequestOp{
				getOp(b.leaseKey(key), base+"j"),
				getOp(hb, clientv3.GetPrefixRangeEnd(hb)),
			},
		}
		got := &pb.TxnRequest{Compare: k.freeCheck(), Failure: k.holderReads()}
		if !proto.Equal(got, want) {
			t.Errorf("key %q: got %v, want %v", key, got, want)
		}
		l := backend.Lease{Key: key, HolderID: "h", Token: "t"}
		if _, rec := b.tokenCheckKey(l); string(rec) != b.leaseKey(key) {
			t.Errorf("key %q: tokenCheckKey's key %q, want %q", key, rec, b.leaseKey(key))
		}
	}
}

// createIs is the comparison "create revision of key = rev", over the range
// [key, end) when end is not empty (etcd then compares every key in it, and
// an empty range as a key with revision 0): what freeCheck built before
// acquireKeys, kept as its reference.
func createIs(key, end string, rev int64) *pb.Compare {
	c := &pb.Compare{
		Result:      pb.Compare_EQUAL,
		Target:      pb.Compare_CREATE,
		Key:         []byte(key),
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: rev},
	}
	if end != "" {
		c.RangeEnd = []byte(end)
	}
	return c
}

// getOp reads key, or the range [key, end) when end is not empty: what
// holderReads built before acquireKeys, kept as its reference.
func getOp(key, end string) *pb.RequestOp {
	r := &pb.RangeRequest{Key: []byte(key)}
	if end != "" {
		r.RangeEnd = []byte(end)
	}
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
}
