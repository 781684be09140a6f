package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sovereign-go/sovereign"
)

// sovOptions are the elector options of the latency scenarios: the short TTL
// shared by every implementation, no startup jitter, defaults otherwise.
func sovOptions(ttl time.Duration) sovereign.Options {
	return sovereign.Options{TTL: ttl, NoStartupJitter: true}
}

// sovHandover measures n graceful hand-overs between two Sovereign
// electors: from the leader's Resign call to the other elector's
// LeadershipAcquired event.
func (e *env) sovHandover(k kind, n int, ttl time.Duration) ([]time.Duration, error) {
	name := e.name("handover")
	opts := sovOptions(ttl)
	var cs []*sovCandidate
	defer func() {
		for _, c := range cs {
			c.close()
		}
	}()
	for _, id := range []string{"a", "b"} {
		c, err := e.newSovCandidate(k, name, name+"-"+id, opts)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	l, err := waitSovLeader(cs, 10*time.Second)
	if err != nil {
		return nil, err
	}
	f := cs[0]
	if f == l {
		f = cs[1]
	}
	sitOut := cs[0].e.Options().ResignSitOut
	// Resign is called from one long-lived goroutine, as the Election
	// candidates' Resign is called from their loop goroutine: a goroutine
	// made for each call would add the growth of its fresh stack (about
	// 30 µs on the release path) to every sample.
	resign := make(chan resignJob)
	defer close(resign)
	go func() {
		for j := range resign {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			j.errc <- j.c.e.Resign(ctx)
			cancel()
		}
	}()
	var out []time.Duration
	for range n {
		// Pacing, not synchronisation: the previous leader sits out after
		// its Resign; let that end so the next hand-over has a candidate.
		time.Sleep(sitOut + 50*time.Millisecond)
		drain(f.acquired)
		errc := make(chan error, 1)
		t0 := time.Now()
		resign <- resignJob{l, errc}
		var t1 time.Time
		select {
		case t1 = <-f.acquired:
		case <-time.After(10 * time.Second):
			return out, fmt.Errorf("%s hand-over: no new leader within 10s", k)
		}
		if err := <-errc; err != nil {
			return out, fmt.Errorf("%s hand-over: Resign: %w", k, err)
		}
		out = append(out, t1.Sub(t0))
		l, f = f, l
	}
	return out, nil
}

// resignJob is a Resign for sovHandover's resigning goroutine to make.
type resignJob struct {
	c    *sovCandidate
	errc chan<- error
}

// electionHandover measures n graceful hand-overs between two etcd
// concurrency.Election candidates: from the leader's Resign call to the
// return of the other's Campaign.
func (e *env) electionHandover(n int, ttl time.Duration) ([]time.Duration, error) {
	pfx := e.name("election-handover")
	a, err := e.newElCandidate(pfx, "a", int(ttl/time.Second))
	if err != nil {
		return nil, err
	}
	defer a.close()
	if err := waitElected(a, 10*time.Second); err != nil {
		return nil, err
	}
	b, err := e.newElCandidate(pfx, "b", int(ttl/time.Second))
	if err != nil {
		return nil, err
	}
	defer b.close()
	l, f := a, b
	var out []time.Duration
	for range n {
		// Both candidates must have their key in place, as in a steady state.
		if err := waitCampaigners(l.cli, pfx, 2, 10*time.Second); err != nil {
			return out, err
		}
		// Pacing, the same as for Sovereign (its default ResignSitOut, TTL/5,
		// plus 50 ms): the follower has been waiting that long, as in a
		// steady state. (A follower whose Campaign started less than 100 ms
		// ago may still have an unsynced etcd watch, which the server
		// serves only every 100 ms.)
		time.Sleep(ttl/5 + 50*time.Millisecond)
		drain(f.elected)
		r := make(chan error, 1)
		t0 := time.Now()
		l.resign <- r
		var t1 time.Time
		select {
		case t1 = <-f.elected:
		case <-time.After(10 * time.Second):
			return out, fmt.Errorf("election hand-over: no new leader within 10s")
		}
		if err := <-r; err != nil {
			return out, fmt.Errorf("election hand-over: Resign: %w", err)
		}
		out = append(out, t1.Sub(t0))
		l, f = f, l
	}
	return out, nil
}

func waitElected(c *elCandidate, bound time.Duration) error {
	select {
	case <-c.elected:
		return nil
	case <-time.After(bound):
		return fmt.Errorf("%s not elected within %v", c.id, bound)
	}
}

// crashSample is one crash failover: the delay beyond the TTL, and the
// requests the follower that took over sent from the crash instant until it
// led (its acquisition included).
type crashSample struct {
	delay    time.Duration
	requests int64
}

// sovCrash measures n crash failovers between Sovereign electors: the
// leader crashes right after a successful renewal (its backend fails every
// call from then on, so nothing is renewed or released), and the figure is
// the time from the crash to another elector's LeadershipAcquired event,
// minus the TTL.
func (e *env) sovCrash(k kind, n int, ttl time.Duration) ([]crashSample, error) {
	name := e.name("crash")
	opts := sovOptions(ttl)
	var cs []*sovCandidate
	defer func() {
		for _, c := range cs {
			c.close()
		}
	}()
	add := func(id string) (*sovCandidate, error) {
		c, err := e.newSovCandidate(k, name, name+"-"+id, opts)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
		return c, nil
	}
	l, err := add("a")
	if err != nil {
		return nil, err
	}
	if _, err := waitSovLeader([]*sovCandidate{l}, 10*time.Second); err != nil {
		return nil, err
	}
	f, err := add("b")
	if err != nil {
		return nil, err
	}
	var out []crashSample
	for i := range n {
		if err := waitFollower(f, 10*time.Second); err != nil {
			return out, err
		}
		drain(f.acquired)
		randomPause()
		l.be.arm()
		var crashAt time.Time
		var r0 int64
		select {
		case crashAt = <-l.be.crashAt:
			r0 = f.requests()
		case <-time.After(10 * time.Second):
			return out, fmt.Errorf("%s crash: leader did not renew within 10s", k)
		}
		go l.close()
		var t1 time.Time
		select {
		case t1 = <-f.acquired:
		case <-time.After(ttl + 10*time.Second):
			return out, fmt.Errorf("%s crash: no new leader within TTL+10s", k)
		}
		cs := crashSample{t1.Sub(crashAt) - ttl, f.requests() - r0}
		out = append(out, cs)
		progress("  %s crash: +%.1f ms beyond TTL; the follower sent %d requests from the crash to leading", k, ms(cs.delay), cs.requests)
		randomPause()
		nf, err := add(fmt.Sprintf("c%d", i))
		if err != nil {
			return out, err
		}
		l, f = f, nf
	}
	return out, nil
}

// randomPause sleeps for a random time below 500 ms. The crash scenarios
// pause before creating a candidate and before arming a crash, so that
// crash instants fall at random phases of the periodic timers involved (the
// elector's renewals, the etcd client's 500 ms keep-alive loop, the etcd
// server's 500 ms lease-expiry loop). Without it, a candidate created right
// after the previous failover (itself right after an expiry tick) keeps a
// fixed phase to the server's expiry loop, and every sample repeats one
// unlucky (or lucky) delay.
func randomPause() {
	time.Sleep(rand.N(500 * time.Millisecond))
}

// electionCrash measures n crash failovers between etcd
// concurrency.Election candidates: the leader's client is closed without
// revoking its session right after a lease keep-alive response arrived, and
// the figure is the time from then to the return of the next candidate's
// Campaign, minus the session TTL.
func (e *env) electionCrash(n int, ttl time.Duration) ([]crashSample, error) {
	pfx := e.name("election-crash")
	secs := int(ttl / time.Second)
	var cs []*elCandidate
	crashed := make(map[*elCandidate]bool)
	defer func() {
		for _, c := range cs {
			if !crashed[c] {
				c.close()
			}
		}
	}()
	add := func(id string) (*elCandidate, error) {
		c, err := e.newElCandidate(pfx, id, secs)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
		return c, nil
	}
	l, err := add("a")
	if err != nil {
		return nil, err
	}
	if err := waitElected(l, 10*time.Second); err != nil {
		return nil, err
	}
	f, err := add("b")
	if err != nil {
		return nil, err
	}
	var out []crashSample
	for i := range n {
		if err := waitCampaigners(f.cli, pfx, 2, 10*time.Second); err != nil {
			return out, err
		}
		drain(f.elected)
		randomPause()
		var crashAt time.Time
		var r0 int64
		select {
		case crashAt = <-l.armCrash():
			r0 = f.ctr.requests()
		case <-time.After(10 * time.Second):
			return out, fmt.Errorf("election crash: no keep-alive within 10s")
		}
		crashed[l] = true
		l.crash()
		var t1 time.Time
		select {
		case t1 = <-f.elected:
		case <-time.After(ttl + 10*time.Second):
			return out, fmt.Errorf("election crash: no new leader within TTL+10s")
		}
		cs := crashSample{t1.Sub(crashAt) - ttl, f.ctr.requests() - r0}
		out = append(out, cs)
		progress("  election crash: +%.1f ms beyond TTL; the follower sent %d requests from the crash to leading", ms(cs.delay), cs.requests)
		randomPause()
		nf, err := add(fmt.Sprintf("c%d", i))
		if err != nil {
			return out, err
		}
		l, f = f, nf
	}
	return out, nil
}
