package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/memorybackend"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// backendFlags are the flags that choose and reach the backend. The TLS and
// auth flags use etcdctl's names. There is deliberately no password flag: a
// password comes from the URL (best passed through SOVEREIGN_BACKEND, which
// the process list does not show) or from --password-file.
type backendFlags struct {
	url                string
	cacert, cert, key  string
	insecureSkipVerify bool
	user               string
	passwordFile       string
	storePrefix        string
	restartGuard       bool
	dialTimeout        time.Duration
	commandTimeout     time.Duration
}

// register adds the backend flags to fs, with the current values as
// defaults, writing to f.
func (f *backendFlags) register(fs *flag.FlagSet) {
	if f.dialTimeout == 0 {
		f.dialTimeout = 5 * time.Second
	}
	if f.commandTimeout == 0 {
		f.commandTimeout = 5 * time.Second
	}
	fs.StringVar(&f.url, "backend", f.url, "backend `URL`: redis://, rediss://, unix://, redis+sentinel://, redis+cluster://, etcd://h1:2379,h2:2379, etcds://, memory:// (default $SOVEREIGN_BACKEND)")
	fs.StringVar(&f.cacert, "cacert", f.cacert, "verify the server's TLS certificate with this CA bundle `file`")
	fs.StringVar(&f.cert, "cert", f.cert, "TLS client certificate `file`")
	fs.StringVar(&f.key, "key", f.key, "TLS client key `file`")
	fs.BoolVar(&f.insecureSkipVerify, "insecure-skip-tls-verify", f.insecureSkipVerify, "do not verify the server's TLS certificate")
	fs.StringVar(&f.user, "user", f.user, "user `name` for authentication (the password comes from the URL or --password-file)")
	fs.StringVar(&f.passwordFile, "password-file", f.passwordFile, "read the password from `file` (one line)")
	fs.BoolVar(&f.restartGuard, "restart-guard", f.restartGuard, "Redis: the server refuses every free key until it has been up for the TTL, so a restart that lost a live lease hands it to nobody (the library's Options.RestartGuard)")
	fs.StringVar(&f.storePrefix, "store-prefix", f.storePrefix, "key prefix in the store, as in the library's Options.Prefix (default \"sovereign:\" on Redis, \"sovereign/\" on etcd)")
	fs.DurationVar(&f.dialTimeout, "dial-timeout", f.dialTimeout, "timeout for connecting to the backend")
	fs.DurationVar(&f.commandTimeout, "command-timeout", f.commandTimeout, "timeout of each read (status, list, members, break)")
}

// opened is an open backend and what closes it.
type opened struct {
	backend.Backend
	close func()
	// redacted is the URL without its password, for display.
	redacted string
}

// Close closes the backend and then its client.
func (o *opened) Close() error {
	o.close()
	return nil
}

// open connects to the backend named by f.url. It does no I/O for Redis and
// etcd (the clients connect lazily); callers probe with a read.
func (f *backendFlags) open() (*opened, error) {
	if f.url == "" {
		return nil, usageError("no backend: pass --backend URL or set SOVEREIGN_BACKEND")
	}
	scheme, _, ok := strings.Cut(f.url, "://")
	if !ok {
		return nil, usageError("backend URL %q has no scheme (redis://, etcd://, memory://, ...)", f.url)
	}
	password, err := f.password()
	if err != nil {
		return nil, err
	}
	if f.dialTimeout <= 0 {
		f.dialTimeout = 5 * time.Second // etcd's client would otherwise wait forever to authenticate
	}
	if f.restartGuard && scheme != "unix" && !strings.HasPrefix(scheme, "redis") {
		return nil, usageError("--restart-guard is for Redis backends, not %s://", scheme)
	}
	switch scheme {
	case "redis", "rediss", "unix":
		opt, err := redis.ParseURL(f.url)
		if err != nil {
			return nil, usageError("backend URL: %v", err)
		}
		if err := f.redisCommon(&opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.Username, &opt.Password, &opt.TLSConfig, password); err != nil {
			return nil, err
		}
		return f.redis(redis.NewClient(opt))
	case "redis+sentinel", "rediss+sentinel":
		opt, err := redis.ParseFailoverURL(strings.Replace(f.url, "+sentinel", "", 1))
		if err != nil {
			return nil, usageError("backend URL: %v", err)
		}
		if opt.MasterName == "" {
			return nil, usageError("backend URL: redis+sentinel:// needs ?master_name=NAME")
		}
		if err := f.redisCommon(&opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.Username, &opt.Password, &opt.TLSConfig, password); err != nil {
			return nil, err
		}
		return f.redis(redis.NewFailoverClient(opt))
	case "redis+cluster", "rediss+cluster":
		opt, err := redis.ParseClusterURL(strings.Replace(f.url, "+cluster", "", 1))
		if err != nil {
			return nil, usageError("backend URL: %v", err)
		}
		if err := f.redisCommon(&opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.Username, &opt.Password, &opt.TLSConfig, password); err != nil {
			return nil, err
		}
		return f.redis(redis.NewClusterClient(opt))
	case "etcd", "etcds":
		return f.etcd(scheme == "etcds", password)
	case "memory":
		b := memorybackend.New()
		return &opened{Backend: b, close: func() { b.Close() }, redacted: "memory://"}, nil
	}
	return nil, usageError("backend URL scheme %q is not one of redis, rediss, unix, redis+sentinel, redis+cluster, etcd, etcds, memory", scheme)
}

// redisClient is what the Redis constructors return.
type redisClient interface {
	redisbackend.Client
	Close() error
}

func (f *backendFlags) redis(c redisClient) (*opened, error) {
	b, err := redisbackend.New(c, &redisbackend.Options{Prefix: f.storePrefix, RestartGuard: f.restartGuard})
	if err != nil {
		c.Close()
		return nil, usageError("%v", err)
	}
	return &opened{Backend: b, redacted: redact(f.url), close: func() {
		b.Close()
		c.Close()
	}}, nil
}

// etcd opens etcd://[user[:password]@]host:port[,host:port...].
func (f *backendFlags) etcd(useTLS bool, password string) (*opened, error) {
	rest := strings.SplitN(f.url, "://", 2)[1]
	rest, _, _ = strings.Cut(rest, "/")
	user := ""
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		info := rest[:at]
		rest = rest[at+1:]
		u, p, hasPass := strings.Cut(info, ":")
		var err error
		if user, err = url.PathUnescape(u); err != nil {
			return nil, usageError("backend URL: bad user name: %v", err)
		}
		if hasPass && password == "" {
			if password, err = url.PathUnescape(p); err != nil {
				return nil, usageError("backend URL: bad password: %v", err)
			}
		}
	}
	if f.user != "" {
		user = f.user
	}
	if user != "" && password == "" {
		return nil, usageError("etcd user %q needs a password: in the URL or with --password-file", user)
	}
	var endpoints []string
	for _, h := range strings.Split(rest, ",") {
		if h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "2379")
		}
		endpoints = append(endpoints, h)
	}
	if len(endpoints) == 0 {
		return nil, usageError("backend URL %q names no etcd endpoint", redact(f.url))
	}
	var tlsCfg *tls.Config
	if useTLS || f.cacert != "" || f.cert != "" || f.insecureSkipVerify {
		var err error
		if tlsCfg, err = f.tlsConfig(&tls.Config{MinVersion: tls.VersionTLS12}); err != nil {
			return nil, err
		}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: f.dialTimeout,
		TLS:         tlsCfg,
		Username:    user,
		Password:    password,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, exitWith(exitUnavailable, fmt.Errorf("etcd: %w", err))
	}
	var opts *etcdbackend.Options
	if f.storePrefix != "" {
		opts = &etcdbackend.Options{Prefix: f.storePrefix}
	}
	b, err := etcdbackend.New(cli, opts)
	if err != nil {
		cli.Close()
		return nil, usageError("%v", err)
	}
	return &opened{Backend: b, redacted: redact(f.url), close: func() {
		b.Close()
		cli.Close()
	}}, nil
}

// password returns the password from --password-file, or "".
func (f *backendFlags) password() (string, error) {
	if f.passwordFile == "" {
		return "", nil
	}
	data, err := os.ReadFile(f.passwordFile)
	if err != nil {
		return "", usageError("--password-file: %v", err)
	}
	p, _, _ := strings.Cut(string(data), "\n")
	return strings.TrimRight(p, "\r"), nil
}

// tlsConfig applies the TLS flags to cfg. It returns cfg unchanged (nil
// included) when no TLS flag is set; any TLS flag enables TLS.
func (f *backendFlags) tlsConfig(cfg *tls.Config) (*tls.Config, error) {
	if f.cacert == "" && f.cert == "" && f.key == "" && !f.insecureSkipVerify {
		return cfg, nil
	}
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if f.cacert != "" {
		pem, err := os.ReadFile(f.cacert)
		if err != nil {
			return nil, usageError("--cacert: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageError("--cacert: no PEM certificate in %s", f.cacert)
		}
		cfg.RootCAs = pool
	}
	if (f.cert == "") != (f.key == "") {
		return nil, usageError("--cert and --key go together")
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, usageError("--cert/--key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	cfg.InsecureSkipVerify = f.insecureSkipVerify
	return cfg, nil
}

// redact returns u with any password replaced by "xxxxx".
func redact(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	host, path, hasPath := strings.Cut(rest, "/")
	if at := strings.LastIndex(host, "@"); at >= 0 {
		if user, _, hasPass := strings.Cut(host[:at], ":"); hasPass {
			host = user + ":xxxxx" + host[at:]
		}
	}
	// Query parameters (password=, sentinel_password=) are dropped entirely.
	if hasPath {
		path, _, _ = strings.Cut(path, "?")
		return scheme + "://" + host + "/" + path
	}
	host, _, _ = strings.Cut(host, "?")
	return scheme + "://" + host
}

// probe reads key once to find out whether the backend answers. A key
// nobody holds is an answer.
func probe(ctx context.Context, b backend.Backend, key string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := b.Get(ctx, key)
	if err == nil || errors.Is(err, backend.ErrNotHeld) {
		return nil
	}
	return unreachable(err)
}

// unreachable classifies a backend error: invalid arguments are usage
// errors, everything else means the backend could not be used (exit 69).
func unreachable(err error) error {
	switch {
	case errors.Is(err, backend.ErrInvalid):
		return exitWith(exitUsage, err)
	case errors.Is(err, errors.ErrUnsupported):
		return exitWith(exitSoftware, err)
	}
	return exitWith(exitUnavailable, fmt.Errorf("backend unreachable: %w", err))
}

// redisCommon sets what every kind of Redis client takes from the flags, on
// the fields of its options (redis.Options, FailoverOptions and
// ClusterOptions are distinct types with the same fields): timeouts bound
// by the context, the dial timeout, the user and password when given, and
// the TLS configuration.
func (f *backendFlags) redisCommon(ctxTimeout *bool, dial *time.Duration, user, pass *string, tlsConf **tls.Config, password string) error {
	*ctxTimeout = true
	*dial = f.dialTimeout
	if f.user != "" {
		*user = f.user
	}
	if password != "" {
		*pass = password
	}
	var err error
	*tlsConf, err = f.tlsConfig(*tlsConf)
	return err
}
