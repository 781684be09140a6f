package testetcd

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, IgnoredGoroutines()...)
}

func TestStartSingleMember(t *testing.T) {
	c := Start(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("got %v, want one kv k=v", resp.Kvs)
	}
	// The tuned election timeout makes 1 s the smallest lease etcd grants.
	g, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	if g.TTL != 1 {
		t.Fatalf("got granted TTL %d, want 1", g.TTL)
	}
}

func TestClusterStopRestart(t *testing.T) {
	c := StartCluster(t, 3)
	if got := len(c.Endpoints()); got != 3 {
		t.Fatalf("got %d endpoints, want 3", got)
	}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "1"); err != nil {
		t.Fatalf("put: %v", err)
	}
	lead := c.LeaderIndex()
	if lead < 0 {
		t.Fatal("got no leader, want one")
	}
	c.Stop(lead)
	if c.Running(lead) {
		t.Fatalf("member %d still running after Stop", lead)
	}
	// The two remaining members keep a quorum and elect a new leader.
	if _, err := cli.Put(ctx, "k", "2"); err != nil {
		t.Fatalf("put with one member down: %v", err)
	}
	if err := c.Restart(lead); err != nil {
		t.Fatalf("restart: %v", err)
	}
	one := NewClient(t, c.ClientConfig(c.Endpoint(lead)))
	// A linearizable read through the restarted member sees the write made
	// while it was down.
	for {
		resp, err := one.Get(ctx, "k")
		if err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "2" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("restarted member never served k=2: last err %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling an observable condition
	}
}

// TestRestartKeepsData: a stopped member restarts on the same data, and a
// client made before the stop, with the configuration users get, reads it.
func TestRestartKeepsData(t *testing.T) {
	c := Start(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	c.Stop(0)
	if c.Running(0) {
		t.Fatal("member still running after Stop")
	}
	if err := c.Restart(0); err != nil {
		t.Fatalf("restart: %v", err)
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get after the restart: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("got %v, want k=v kept across the restart", resp.Kvs)
	}
}

// TestRestartWithoutData: the member comes back empty, with revisions
// starting over, and a client made before the restart reaches it.
func TestRestartWithoutData(t *testing.T) {
	c := Start(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rev int64
	for range 5 {
		resp, err := cli.Put(ctx, "k", "v")
		if err != nil {
			t.Fatalf("put: %v", err)
		}
		rev = resp.Header.Revision
	}
	if err := c.RestartWithoutData(0); err != nil {
		t.Fatalf("RestartWithoutData: %v", err)
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get after the restart: %v", err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("got %v, want no keys after a restart without data", resp.Kvs)
	}
	if resp.Header.Revision >= rev {
		t.Errorf("revision after a restart without data: got %d, want below %d", resp.Header.Revision, rev)
	}
	if err := StartCluster(t, 3).RestartWithoutData(0); err == nil {
		t.Error("RestartWithoutData on a three-member cluster: got nil error, want one")
	}
}

// TestRestoreBackup: a restore brings back the backup's keys and leases
// and drops what was written since; without a bump revisions go back, with
// one they go up by it and a watch from before the restore is told its
// revision was compacted.
func TestRestoreBackup(t *testing.T) {
	for _, bump := range []uint64{0, 1000} {
		t.Run(fmt.Sprintf("bump %d", bump), func(t *testing.T) {
			c := Start(t)
			cli := c.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			grant, err := cli.Grant(ctx, 5)
			if err != nil {
				t.Fatalf("grant: %v", err)
			}
			if _, err := cli.Put(ctx, "kept", "v", clientv3.WithLease(grant.ID)); err != nil {
				t.Fatalf("put: %v", err)
			}
			if _, err := cli.Put(ctx, "deleted", "v"); err != nil {
				t.Fatalf("put: %v", err)
			}
			file, err := c.Backup(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Delete(ctx, "deleted"); err != nil {
				t.Fatalf("delete: %v", err)
			}
			put, err := cli.Put(ctx, "new", "v")
			if err != nil {
				t.Fatalf("put: %v", err)
			}
			before := put.Header.Revision
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			watch := cli.Watch(wctx, "new", clientv3.WithRev(before+1))

			if err := c.RestoreBackup(0, file, bump); err != nil {
				t.Fatal(err)
			}
			for k, want := range map[string]int{"kept": 1, "deleted": 1, "new": 0} {
				resp, err := cli.Get(ctx, k)
				if err != nil {
					t.Fatalf("get %s after the restore: %v", k, err)
				}
				if len(resp.Kvs) != want {
					t.Errorf("%s after the restore: got %d keys, want %d", k, len(resp.Kvs), want)
				}
				if k == "kept" && len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) != grant.ID {
					t.Errorf("kept after the restore: on lease %x, want %x", resp.Kvs[0].Lease, grant.ID)
				}
			}
			ttl, err := cli.TimeToLive(ctx, grant.ID)
			if err != nil || ttl.TTL <= 0 {
				t.Errorf("lease of the backup after the restore: TTL %v, %v; want it alive", ttl, err)
			}
			resp, err := cli.Put(ctx, "probe", "v")
			if err != nil {
				t.Fatalf("put after the restore: %v", err)
			}
			switch rev := resp.Header.Revision; {
			case bump == 0 && rev > before:
				t.Errorf("revision after a restore without a bump: got %d, want at most %d", rev, before)
			case bump > 0 && rev <= before:
				t.Errorf("revision after a restore with a bump of %d: got %d, want above %d", bump, rev, before)
			}
			if bump > 0 {
				// The watch from before resumes at a compacted revision.
				select {
				case wr := <-watch:
					if wr.CompactRevision == 0 {
						t.Errorf("watch after the restore: got %+v, want a compaction", wr)
					}
				case <-ctx.Done():
					t.Fatal("no watch response after the restore")
				}
			}
		})
	}
}
