package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Write is one write that reached the fenced store.
type Write struct {
	// ID is the writer's process name (Proc.ID).
	ID string
	// Term is the fencing term the writer sent.
	Term uint64
	// Seq is the writer's sequence number within its term.
	Seq uint64
	// At is when the store received it (Now()).
	At int64
	// Accepted reports whether the store took it; it is false when Term was
	// lower than the highest term seen before.
	Accepted bool
}

// Store is a fenced store: it accepts a write only when its term is at least
// the highest term it has seen, and records every write, accepted or not. It
// serves HTTP on 127.0.0.1: POST /write?id=&term=&seq= answers 204 when
// accepted and 409 when rejected. Its methods are safe for concurrent use.
//
// A Store for a semaphore of n permits (NewSemaphoreStore) accepts a write
// when its term is among the n highest distinct terms of the accepted writes
// (or when fewer than n terms have been accepted): once n newer holders have
// written, an older holder's writes are fenced. It may also fence a holder
// that is still valid (an older permit holder, when newer holders of the
// other permits have come and gone), which costs that holder its writes but
// never lets a stale one through; with n = 1 it is the plain Store.
type Store struct {
	ln  net.Listener
	srv *http.Server
	n   int // permits: how many of the highest terms are accepted

	mu     sync.Mutex // guards top, writes
	top    []uint64   // the n highest distinct accepted terms, highest first
	writes []Write

	served chan struct{} // closed when Serve has returned
}

// NewStore starts a Store on a free port of 127.0.0.1.
func NewStore() (*Store, error) { return NewSemaphoreStore(1) }

// NewSemaphoreStore starts a Store for a semaphore of n permits (n >= 1) on
// a free port of 127.0.0.1.
func NewSemaphoreStore(n int) (*Store, error) {
	if n < 1 {
		return nil, fmt.Errorf("chaos: store for %d permits", n)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: store listen: %w", err)
	}
	s := &Store{ln: ln, n: n, served: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /write", s.handle)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL returns the store's base URL.
func (s *Store) URL() string { return "http://" + s.ln.Addr().String() }

func (s *Store) handle(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	term, err1 := strconv.ParseUint(q.Get("term"), 10, 64)
	seq, err2 := strconv.ParseUint(q.Get("seq"), 10, 64)
	id := q.Get("id")
	if err := errors.Join(err1, err2); err != nil || id == "" {
		http.Error(w, fmt.Sprintf("bad write: id %q: %v", id, err), http.StatusBadRequest)
		return
	}
	if s.Write(id, term, seq) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusConflict)
}

// Write applies one write and reports whether it was accepted.
func (s *Store) Write(id string, term, seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := len(s.top) < s.n || term >= s.top[len(s.top)-1]
	if ok && !slices.Contains(s.top, term) {
		i, _ := slices.BinarySearchFunc(s.top, term, func(a, b uint64) int { return cmp.Compare(b, a) })
		s.top = slices.Insert(s.top, i, term)
		s.top = s.top[:min(len(s.top), s.n)]
	}
	s.writes = append(s.writes, Write{ID: id, Term: term, Seq: seq, At: Now(), Accepted: ok})
	return ok
}

// Writes returns every write received so far, in arrival order.
func (s *Store) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Write(nil), s.writes...)
}

// Last returns the latest accepted write, if any.
func (s *Store) Last() (Write, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.writes) - 1; i >= 0; i-- {
		if s.writes[i].Accepted {
			return s.writes[i], true
		}
	}
	return Write{}, false
}

// LastAccepted returns the latest n accepted writes (fewer if there are
// not so many), the newest first.
func (s *Store) LastAccepted(n int) []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Write
	for i := len(s.writes) - 1; i >= 0 && len(out) < n; i-- {
		if s.writes[i].Accepted {
			out = append(out, s.writes[i])
		}
	}
	return out
}

// Recent returns the writes received in the last d, accepted or not, in
// arrival order.
func (s *Store) Recent(d time.Duration) []Write {
	from := Now() - int64(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	i := len(s.writes)
	for i > 0 && s.writes[i-1].At >= from {
		i--
	}
	return append([]Write(nil), s.writes[i:]...)
}

// Close stops the server, closing its connections, and waits for it.
func (s *Store) Close() error {
	err := s.srv.Close()
	<-s.served
	return err
}

// StoreClient writes to a Store over HTTP.
type StoreClient struct {
	base string
	c    *http.Client
	tr   *http.Transport
}

// NewStoreClient returns a client of the store at base (Store.URL()).
func NewStoreClient(base string) *StoreClient {
	tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
	return &StoreClient{base: base, c: &http.Client{Transport: tr, Timeout: 5 * time.Second}, tr: tr}
}

// Write sends one write and reports whether the store accepted it; err is
// set when the store could not be reached or answered something else.
func (c *StoreClient) Write(ctx context.Context, id string, term, seq uint64) (accepted bool, err error) {
	u := c.base + "/write?" + url.Values{
		"id":   {id},
		"term": {strconv.FormatUint(term, 10)},
		"seq":  {strconv.FormatUint(seq, 10)},
	}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return false, err
	}
	resp, err := c.c.Do(req)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return true, nil
	case http.StatusConflict:
		return false, nil
	default:
		return false, fmt.Errorf("chaos: store answered %s", resp.Status)
	}
}

// Close closes the client's idle connections.
func (c *StoreClient) Close() { c.tr.CloseIdleConnections() }
