package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/memorybackend"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestOpenURLs opens every kind of backend URL (no I/O happens: the clients
// connect lazily) and checks the errors of bad ones.
func TestOpenURLs(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		url      string
		flags    backendFlags
		wantType string
		wantCode int // 0: opens
	}{
		{url: "redis://127.0.0.1:6379/0", wantType: "redis"},
		{url: "rediss://user:pw@127.0.0.1:6379", wantType: "redis"},
		{url: "unix:///run/redis.sock", wantType: "redis"},
		{url: "redis+sentinel://127.0.0.1:26379?master_name=mymaster", wantType: "redis"},
		{url: "redis+sentinel://127.0.0.1:26379", wantCode: exitUsage},
		{url: "redis+cluster://127.0.0.1:7000?addr=127.0.0.1:7001", wantType: "redis"},
		{url: "etcd://127.0.0.1:2379,127.0.0.1:22379", wantType: "etcd"},
		{url: "etcd://root@127.0.0.1:2379", wantCode: exitUsage}, // a user without a password
		// With a user, etcd's client authenticates at once: nothing listens
		// at dead, so it reports the backend unreachable.
		{url: "etcd://root@" + dead, flags: backendFlags{passwordFile: pw, dialTimeout: 200 * time.Millisecond}, wantCode: exitUnavailable},
		{url: "etcd://root:pw@" + dead, flags: backendFlags{dialTimeout: 200 * time.Millisecond}, wantCode: exitUnavailable},
		{url: "etcd://" + dead, flags: backendFlags{user: "root", passwordFile: pw, dialTimeout: 200 * time.Millisecond}, wantCode: exitUnavailable},
		{url: "etcd://127.0.0.1:2379", flags: backendFlags{cert: "x.pem"}, wantCode: exitUsage}, // --cert without --key
		{url: "etcd://127.0.0.1:2379", flags: backendFlags{cacert: "/nonexistent"}, wantCode: exitUsage},
		{url: "etcds://127.0.0.1:2379", wantType: "etcd"},
		{url: "memory://", wantType: "memory"},
		{url: "ftp://x", wantCode: exitUsage},
		{url: "127.0.0.1:6379", wantCode: exitUsage},
		{url: "", wantCode: exitUsage},
	} {
		t.Run(tc.url, func(t *testing.T) {
			f := tc.flags
			f.url = tc.url
			o, err := f.open()
			var ee *exitError
			if tc.wantCode != 0 {
				if !errors.As(err, &ee) || ee.code != tc.wantCode {
					t.Fatalf("got %v, want exit code %d", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v, want it to open", err)
			}
			defer o.Close()
			var typ string
			switch o.Backend.(type) {
			case *redisbackend.Backend:
				typ = "redis"
			case *etcdbackend.Backend:
				typ = "etcd"
			case *memorybackend.Backend:
				typ = "memory"
			}
			if typ != tc.wantType {
				t.Fatalf("got a %T, want a %s backend", o.Backend, tc.wantType)
			}
		})
	}
}
