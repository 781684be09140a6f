package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// clusterMasters is the number of masters of the bench's Redis Cluster.
const clusterMasters = 3

// errClusterNotReady is returned when the cluster does not reach
// cluster_state:ok in time.
var errClusterNotReady = errors.New("bench: redis cluster not ready")

// redisCluster is a Redis Cluster of clusterMasters masters (no replicas),
// each a redis-server on a free loopback port, started by the bench.
type redisCluster struct {
	nodes []*testredis.Server
}

// startCluster launches clusterMasters cluster-enabled redis-servers, gives
// each an equal share of the 16384 slots with CLUSTER ADDSLOTSRANGE, joins
// them with CLUSTER MEET and waits until every node reports
// cluster_state:ok and knows every master.
func startCluster(bin string) (_ *redisCluster, err error) {
	c := &redisCluster{}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	var busPorts []int
	for range clusterMasters {
		// The bus port is chosen here: the default, the client port +
		// 10000, is out of range for many free ports.
		bus, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("bench: cluster bus port: %w", err)
		}
		// Not testredis.Config.Cluster, which makes a node serve every slot
		// by itself: here the slots are shared out below.
		s, err := testredis.Launch(bin, testredis.Config{Args: []string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000",
			"--cluster-port", strconv.Itoa(bus),
		}})
		if err != nil {
			return nil, fmt.Errorf("bench: cluster node: %w", err)
		}
		c.nodes = append(c.nodes, s)
		busPorts = append(busPorts, bus)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	per := 16384 / clusterMasters
	for i, s := range c.nodes {
		cli := redis.NewClient(&redis.Options{Addr: s.Addr()})
		lo, hi := i*per, (i+1)*per-1
		if i == len(c.nodes)-1 {
			hi = 16383
		}
		err := cli.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err()
		if err == nil && i > 0 {
			host, port, _ := net.SplitHostPort(c.nodes[0].Addr())
			err = cli.Do(ctx, "CLUSTER", "MEET", host, port, busPorts[0]).Err()
		}
		cli.Close()
		if err != nil {
			return nil, fmt.Errorf("bench: cluster node %s: %w", s.Addr(), err)
		}
	}
	for _, s := range c.nodes {
		if err := waitClusterOK(ctx, s.Addr()); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// waitClusterOK waits until the node at addr reports cluster_state:ok with
// every master known.
func waitClusterOK(ctx context.Context, addr string) error {
	cli := redis.NewClient(&redis.Options{Addr: addr})
	defer cli.Close()
	want := fmt.Sprintf("cluster_size:%d", clusterMasters)
	var last string
	for {
		info, err := cli.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want) {
			return nil
		}
		last = info
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: node %s: %q", errClusterNotReady, addr, last)
		case <-time.After(50 * time.Millisecond): // polling the server's cluster state
		}
	}
}

// Addrs returns the nodes' host:port addresses.
func (c *redisCluster) Addrs() []string {
	var a []string
	for _, s := range c.nodes {
		a = append(a, s.Addr())
	}
	return a
}

// PIDs returns the nodes' process IDs.
func (c *redisCluster) PIDs() []int {
	var p []int
	for _, s := range c.nodes {
		p = append(p, s.PID())
	}
	return p
}

// Close stops every node and removes their directories.
func (c *redisCluster) Close() {
	for _, s := range c.nodes {
		s.Close()
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// newClusterClient returns a cluster client of addrs named name, counting
// commands with hook when it is not nil.
func newClusterClient(addrs []string, name string, hook *cmdCounter) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 addrs,
		ClientName:            name,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	})
	if hook != nil {
		c.AddHook(hook)
	}
	return c
}
