package etcdbackend_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// TestElectorsSurviveServerRestart: three electors (TTL 2 s) on one etcd
// server, each with its own client. The server is stopped for longer than
// the leader's renew deadline, and started again on the same data; etcd then
// restores every lease with a full TTL. A leader must exist within TTL + 1 s
// of the server being up, and never two at once.
//
// With ClientConfig, the configuration the package documents, the clients
// reconnect within a second anyway. With a bare configuration, gRPC's
// reconnect backoff after a 5 s outage left the electors without a
// connection for more than 3 s after the server was back (measured), unless
// the backend resets that backoff when a call finds the client disconnected.
func TestElectorsSurviveServerRestart(t *testing.T) {
	const ttl = 2 * time.Second
	tests := []struct {
		name   string
		config func(clientv3.Config) clientv3.Config
		outage time.Duration
	}{
		{"ClientConfig", nil, 2 * time.Second},
		{"bare config", func(cfg clientv3.Config) clientv3.Config {
			return clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 3 * time.Second, Logger: cfg.Logger}
		}, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ec := testetcd.Start(t)
			c := newCandidatesConfig(t, ec, 3, &sovereign.Options{TTL: ttl}, tt.config)
			old := c.leader(nil)
			oldTerm := old.e.Term()
			sampler := sampleLeaders(c)

			ec.Stop(0)
			<-time.After(tt.outage) // an outage of a given length, not synchronisation
			restart := time.Now()
			if err := ec.Restart(0); err != nil {
				t.Fatal(err)
			}
			up := time.Now()

			// Poll for a leader for TTL + 1 s, no longer.
			var leader *candidate
			deadline := up.Add(ttl + time.Second)
			for leader == nil && time.Now().Before(deadline) {
				for _, cand := range c.cands {
					if cand.e.IsLeader() {
						leader = cand
					}
				}
				<-time.After(5 * time.Millisecond) // polling the electors' state
			}
			if leader == nil {
				t.Errorf("no leader %v after the server was up again (down %v, restart took %v), want one within TTL + 1s = %v",
					time.Since(up), tt.outage, up.Sub(restart), ttl+time.Second)
			} else {
				t.Logf("%s leads (term %d; before the outage %s, term %d) %v after the server was up again",
					leader.id, leader.e.Term(), old.id, oldTerm, time.Since(up))
			}
			if most := sampler(); most > 1 {
				t.Errorf("leaders at once (sampled every millisecond): got %d, want at most 1", most)
			}
			c.stopAll()
			c.checkNoOverlap()
		})
	}
}
