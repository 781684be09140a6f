package redisbackend

// BatchGroup implements backend.BatchGrouper: on a Cluster, the hash slot
// of key's lease hash (its heartbeat records share it), so that the lease
// keeper and the elector send the renewals and heartbeats of one slot in
// one batch call per interval, where a master's script serves them with
// the others of that master (nodebatch.go); 0 on a single server, where one
// script serves any keys.
func (b *Backend) BatchGroup(key string) uint32 {
	if b.cluster == nil {
		return 0
	}
	return uint32(keySlot(b.keyBase(key)))
}
