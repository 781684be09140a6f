// Command tally shows a lock guarding a job that must not run twice, in an
// HTTP service: POST /elections/{n}/tally starts the tally of election n in
// the background and answers 202, or 409 with who started it, when, under
// which fencing term and how far it got, read from the lock's record in the
// same round trip as the failed attempt. The tally reports its progress
// with SetMetadata ("25/50 chunks"), which GET /elections/{n}/tally shows
// to anyone. Two servers share the lock store; 20 requests hit them at
// once, and exactly one starts the tally. Then the server doing the tally
// stops renewing (its connection is cut, as a kill -9 or a crash would):
// its tally stops at its renew deadline, and the next request after the
// lock's TTL starts the tally again. It runs on the in-memory backend, so
// no server is needed; main_test.go shows the same service tested in a
// testing/synctest bubble, on virtual time.
//
//	go run ./examples/tally
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func main() {
	ttl := flag.Duration("ttl", time.Second, "lock TTL")
	chunk := flag.Duration("chunk", 40*time.Millisecond, "how long one of the 50 chunks of the tally takes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *ttl, *chunk); err != nil {
		fmt.Fprintln(os.Stderr, "tally:", err)
		os.Exit(1)
	}
}

// server is one replica of the tally service.
type server struct {
	l      *lock.Locker
	chunks int
	chunk  time.Duration
	say    func(string, ...any)
	wg     sync.WaitGroup // the tallies running in the background
}

func electionKey(n string) string { return lock.Key("tally", "election-"+n) }

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /elections/{n}/tally", s.create)
	mux.HandleFunc("GET /elections/{n}/tally", s.status)
	return mux
}

// conflict is the body of a 409.
type conflict struct {
	Error     string    `json:"error"`
	StartedBy string    `json:"started_by"`
	Server    string    `json:"server"`
	StartedAt time.Time `json:"started_at"`
	Term      uint64    `json:"term"`
	Progress  string    `json:"progress"`
	TTLLeft   string    `json:"ttl_left"` // how long a crashed holder still blocks it
}

func (s *server) create(w http.ResponseWriter, r *http.Request) {
	n := r.PathValue("n")
	md := map[string]string{"user": r.Header.Get("X-User"), "progress": fmt.Sprintf("0/%d chunks", s.chunks)}
	// TryAcquire, not TryDo: the request is answered at once and the tally
	// runs on after it. r.Context() bounds only this attempt; the lock
	// lives until Release.
	lk, err := s.l.TryAcquire(r.Context(), electionKey(n), &lock.AcquireOptions{Metadata: md})
	var held *lock.HeldError
	switch {
	case errors.As(err, &held) && held.MayBeHeld:
		// The store restarted less than a TTL ago (redisbackend's
		// RestartGuard) and cannot tell whether a tally runs: nobody to
		// name, try again when the refusal ends.
		w.Header().Set("Retry-After", fmt.Sprint(int(held.Holder.TTL.Seconds())+1))
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case errors.As(err, &held):
		h := held.Holder
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(conflict{
			Error: err.Error(), StartedBy: h.Metadata["user"], Server: h.HolderID, StartedAt: h.AcquiredAt,
			Term: h.Term, Progress: h.Metadata["progress"], TTLLeft: h.TTL.Round(time.Millisecond).String(),
		})
		return
	case err != nil: // the store is down: no fail-open
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	s.wg.Go(func() {
		err := s.tally(lk, md)
		if rerr := lk.Release(context.Background()); rerr != nil && err == nil {
			err = rerr
		}
		if err != nil {
			s.say("%s: tally of election %s (term %d) stopped: %v", s.l.ID(), n, lk.Term(), err)
		} else {
			s.say("%s: tally of election %s (term %d) done", s.l.ID(), n, lk.Term())
		}
	})
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintf(w, "tally of election %s started by %s on %s (term %d)\n", n, md["user"], s.l.ID(), lk.Term())
}

// tally does the work in chunks while the lock is held, and publishes its
// progress in the lock's metadata.
func (s *server) tally(lk *lock.Lock, md map[string]string) error {
	ctx := lk.Context() // cancelled the moment the lock is lost
	unpublished := 0
	for i := 1; i <= s.chunks; i++ {
		select {
		case <-time.After(s.chunk): // one chunk; a real one passes ctx and lk.Term() downstream
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		// After a pause the timer above and ctx's fall due together, and
		// select may take either: Held reads the clock.
		if !lk.Held() {
			return lk.Err()
		}
		md = maps.Clone(md) // SetMetadata replaces the whole map: send every entry
		md["progress"] = fmt.Sprintf("%d/%d chunks", i, s.chunks)
		if err := lk.SetMetadata(ctx, md); errors.Is(err, lock.ErrLockLost) {
			return err
		} else if err != nil { // the store did not answer: the progress shown lags, the tally goes on
			if unpublished++; unpublished == 1 {
				s.say("%s: progress %d/%d not published, tallying on: %v", s.l.ID(), i, s.chunks, err)
			}
		}
	}
	return nil
}

// status is the body of GET: who runs the tally and how far it got.
type status struct {
	Running  bool      `json:"running"`
	By       string    `json:"by,omitempty"`
	Server   string    `json:"server,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	Progress string    `json:"progress,omitempty"`
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	hs, err := s.l.Holders(r.Context(), electionKey(r.PathValue("n")))
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	var st status
	if len(hs) > 0 {
		h := hs[0]
		st = status{Running: true, By: h.Metadata["user"], Server: h.HolderID, Since: h.AcquiredAt, Progress: h.Metadata["progress"]}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(st)
}

// run starts two servers over one store, sends them 20 requests at once,
// watches the progress, cuts the tallying server off and retries until the
// tally starts again.
func run(ctx context.Context, out io.Writer, ttl, chunk time.Duration) error {
	start := time.Now()
	var mu sync.Mutex // serialises printing
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%6.3fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	store := memorybackend.NewStore() // one store: one simulated Redis or etcd
	type replica struct {
		s    *server
		b    *memorybackend.Backend
		addr string
	}
	var replicas []*replica
	for _, id := range []string{"svc-a", "svc-b"} {
		b := store.Client() // each server has its own connection
		defer b.Close()
		l, err := lock.New(b, id, &lock.Options{TTL: ttl, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		s := &server{l: l, chunks: 50, chunk: chunk, say: say}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: s.handler()}
		go hs.Serve(ln)
		defer func() {
			hs.Close()
			l.Close() // cancels a running tally's lock context and releases
			s.wg.Wait()
		}()
		replicas = append(replicas, &replica{s: s, b: b, addr: ln.Addr().String()})
	}
	post := func(to *replica, user string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, "POST", "http://"+to.addr+"/elections/42/tally", nil)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("X-User", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body)), err
	}
	get := func(from *replica) (status, error) {
		var st status
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+from.addr+"/elections/42/tally", nil)
		if err != nil {
			return st, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return st, err
		}
		defer resp.Body.Close()
		return st, json.NewDecoder(resp.Body).Decode(&st)
	}

	// 20 requests at once, 10 to each server.
	const n = 20
	type answer struct {
		code int
		body string
		err  error
	}
	answers := make([]answer, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-gate
			code, body, err := post(replicas[i%2], fmt.Sprintf("user-%02d", i))
			answers[i] = answer{code, body, err}
		})
	}
	close(gate)
	wg.Wait()
	codes := map[int]int{}
	var winner *replica
	var refusal string
	for i, a := range answers {
		if a.err != nil {
			return a.err
		}
		codes[a.code]++
		switch a.code {
		case http.StatusAccepted:
			winner = replicas[i%2]
			say("202: %s", a.body)
		case http.StatusConflict:
			refusal = a.body
		}
	}
	say("%d requests at once: %d started the tally (202), %d were refused (409)", n, codes[http.StatusAccepted], codes[http.StatusConflict])
	if codes[http.StatusAccepted] != 1 || codes[http.StatusConflict] != n-1 {
		return fmt.Errorf("answers: got %v, want one 202 and %d 409", codes, n-1)
	}
	say("a 409 reads: %s", refusal)

	// Anyone can watch the progress, from either server.
	other := replicas[0]
	if other == winner {
		other = replicas[1]
	}
	for {
		st, err := get(other)
		if err != nil {
			return err
		}
		var done int
		fmt.Sscanf(st.Progress, "%d/", &done)
		if done >= 25 || !st.Running {
			say("status from %s: running %v, by %s on %s, %s", other.s.l.ID(), st.Running, st.By, st.Server, st.Progress)
			break
		}
		select {
		case <-time.After(chunk):
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	// The tallying server stops renewing: its connection is cut, as a
	// kill -9 would. Its tally stops at its renew deadline, before the
	// store lets the lock go; the next request after the TTL starts over.
	winner.b.Partition()
	cut := time.Now()
	say("%s is cut off from the store mid-tally (a crash, a kill -9)", winner.s.l.ID())
	for {
		code, body, err := post(other, "user-retry")
		if err != nil {
			return err
		}
		if code == http.StatusAccepted {
			say("%v after the cut: 202: %s", time.Since(cut).Round(10*time.Millisecond), body)
			break
		}
		if time.Since(cut) < 2*chunk {
			var c conflict
			_ = json.Unmarshal([]byte(body), &c)
			say("right after the cut: %d, still held by %s on %s for %s more", code, c.StartedBy, c.Server, c.TTLLeft)
		}
		select {
		case <-time.After(ttl / 10):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if d := time.Since(cut); d > ttl+ttl/5 {
		return fmt.Errorf("the lock was free %v after its holder stopped renewing, want about its TTL %v", d, ttl)
	}
	winner.s.wg.Wait() // the cut-off tally has stopped already
	st, err := get(other)
	if err != nil {
		return err
	}
	say("status from %s: running %v, by %s on %s, %s", other.s.l.ID(), st.Running, st.By, st.Server, st.Progress)
	say("the demo ends: both servers shut down")
	return nil
}
