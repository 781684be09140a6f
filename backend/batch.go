package backend

import (
	"context"
	"time"
)

// BatchRenewer is an optional capability of a Backend: renewing many leases
// in few requests. The lease keeper (package internal/keeper) gathers the
// renewals of every election and lock of a process that fall due together
// and sends them with one call, so that an instance holding thousands of
// keys sends one request per interval (per Cluster slot, on Redis Cluster)
// rather than one per key.
type BatchRenewer interface {
	// RenewBatch renews each lease exactly as Renew would: owner-checked,
	// by that lease's own TTL, each key on its own (losing one never keeps
	// or drops another). It returns one error per lease, in order: nil for
	// a lease renewed, one wrapping ErrLeaseLost for a lease the store no
	// longer holds, or the error that kept it from being renewed.
	RenewBatch(ctx context.Context, leases []Lease) []error
}

// HeartbeatRequest is one heartbeat of a batch: instance ID is alive for Key,
// under a record that expires after TTL.
type HeartbeatRequest struct {
	Key string
	ID  string
	TTL time.Duration
}

// BatchHeartbeater is an optional capability of a Backend: recording many
// heartbeats in few requests, as BatchRenewer does for renewals.
type BatchHeartbeater interface {
	// HeartbeatBatch records each heartbeat as Heartbeat would and returns
	// one error per request, in order. A backend may leave alone a record
	// that it wrote itself and that will still have more than a quarter of
	// its TTL left when the next batch is due (the same request comes once
	// per interval): the record's age then grows past the interval, but it
	// never expires while batches keep their pace, and a record lost
	// meanwhile is written again within three quarters of its TTL.
	HeartbeatBatch(ctx context.Context, reqs []HeartbeatRequest) []error
}

// BatchGrouper is an optional capability of a BatchRenewer or a
// BatchHeartbeater whose store places keys in groups that one request can
// reach together (Redis Cluster: hash slots). A batch larger than one call
// is split across calls; its callers (the lease keeper and the elector's
// heartbeats) order it by group first, so that the keys of one group go in
// one call, and an instance holding many keys sends one request per group
// per interval rather than one per call and group.
type BatchGrouper interface {
	// BatchGroup returns the group of key (for a heartbeat, of the key of
	// its election). It does no I/O.
	BatchGroup(key string) uint32
}
