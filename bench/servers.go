package main

import (
	"context"
	"time"

	"github.com/sovereign-go/sovereign/internal/testetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdServer is a one-member etcd cluster embedded in this process.
type etcdServer struct {
	c *testetcd.Cluster
}

func startEtcd() (*etcdServer, error) {
	c, err := testetcd.New(1)
	if err != nil {
		return nil, err
	}
	return &etcdServer{c: c}, nil
}

func (s *etcdServer) endpoint() string { return s.c.Endpoints()[0] }

func (s *etcdServer) stop() { s.c.Close() }

// clientConfig returns a client configuration with a silent logger.
func (s *etcdServer) clientConfig() clientv3.Config { return s.c.ClientConfig() }

// version asks the server for its version.
func (s *etcdServer) version() string {
	cli, err := clientv3.New(s.clientConfig())
	if err != nil {
		return "?"
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, s.endpoint())
	if err != nil {
		return "?"
	}
	return st.Version
}
