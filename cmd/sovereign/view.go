package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// lockPrefix is the backend key prefix under which package lock stores its
// keys.
const lockPrefix = "lock/"

// entry is what status, list and serve show about one election or lock.
type entry struct {
	// Key is the backend key (lock keys include "lock/").
	Key string `json:"key"`
	// Name is the election name or the lock key without "lock/".
	Name string `json:"name"`
	// Kind is "election" or "lock".
	Kind string `json:"kind"`
	Held bool   `json:"held"`

	Holder string `json:"holder,omitempty"`
	Term   uint64 `json:"term,omitempty"`
	// Mode is the holder's mode, "exclusive" or "shared", and Limit its
	// Shared limit (0: none).
	Mode       string            `json:"mode,omitempty"`
	Limit      int               `json:"limit,omitempty"`
	Since      *time.Time        `json:"since,omitempty"`
	RenewedAt  *time.Time        `json:"renewed_at,omitempty"`
	TTLSeconds float64           `json:"ttl_seconds"`
	Metadata   map[string]string `json:"metadata,omitempty"`

	LastHeartbeat       *time.Time `json:"last_heartbeat,omitempty"`
	HeartbeatAgeSeconds *float64   `json:"heartbeat_age_seconds,omitempty"`

	// Holders is every live holder of the key (status, on a backend with
	// shared locks; serve, from List): the Shared holders each with their
	// own record, in term order. Holder, Term and the fields above describe
	// the oldest.
	Holders []holder `json:"holders,omitempty"`

	Members  []member `json:"members"`
	Warnings []string `json:"warnings,omitempty"`

	// FullTTLSeconds is the longest TTL seen for this term (serve only), the
	// length of the TTL bar.
	FullTTLSeconds float64 `json:"full_ttl_seconds,omitempty"`
}

// holder is one live holder of a key.
type holder struct {
	ID         string            `json:"id"`
	Term       uint64            `json:"term"`
	Mode       string            `json:"mode"`
	Limit      int               `json:"limit,omitempty"`
	Since      *time.Time        `json:"since,omitempty"`
	TTLSeconds float64           `json:"ttl_seconds"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

func newHolder(r backend.Record) holder {
	h := holder{ID: r.HolderID, Term: r.Term, Mode: r.Mode.String(), Limit: r.Limit, TTLSeconds: ms(r.TTL), Metadata: r.Metadata}
	if !r.AcquiredAt.IsZero() {
		t := r.AcquiredAt
		h.Since = &t
	}
	return h
}

// member is one live heartbeat record.
type member struct {
	ID            string    `json:"id"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	AgeSeconds    float64   `json:"age_seconds"`
	TTLSeconds    float64   `json:"ttl_seconds"`
	Holder        bool      `json:"holder,omitempty"`
}

// kindOf splits a backend key into kind and display name.
func kindOf(key string) (kind, name string) {
	if n, ok := strings.CutPrefix(key, lockPrefix); ok {
		return "lock", n
	}
	return "election", key
}

// newEntry builds the entry of key from its record (nil when nobody holds
// it) and its members.
func newEntry(key string, rec *backend.Record, members []backend.Member) entry {
	e := entry{Key: key, Members: []member{}}
	e.Kind, e.Name = kindOf(key)
	if rec != nil {
		e.Held = true
		e.Holder = rec.HolderID
		e.Term = rec.Term
		e.Mode, e.Limit = rec.Mode.String(), rec.Limit
		e.TTLSeconds = ms(rec.TTL)
		e.Metadata = rec.Metadata
		if !rec.AcquiredAt.IsZero() {
			t := rec.AcquiredAt
			e.Since = &t
		}
		if !rec.RenewedAt.IsZero() {
			t := rec.RenewedAt
			e.RenewedAt = &t
		}
		if rec.HasHeartbeat() {
			t, age := rec.HeartbeatAt, ms(rec.HeartbeatAge)
			e.LastHeartbeat, e.HeartbeatAgeSeconds = &t, &age
		}
	}
	for _, m := range members {
		if rec != nil && m.ID == rec.HolderID && e.LastHeartbeat == nil {
			// A record from List need not carry the holder's heartbeat
			// (etcd's does not): take it from the holder's member record.
			t, age := m.HeartbeatAt, ms(m.Age)
			e.LastHeartbeat, e.HeartbeatAgeSeconds = &t, &age
		}
		e.Members = append(e.Members, member{
			ID:            m.ID,
			LastHeartbeat: m.HeartbeatAt,
			AgeSeconds:    ms(m.Age),
			TTLSeconds:    ms(m.TTL),
			Holder:        rec != nil && m.ID == rec.HolderID,
		})
	}
	return e
}

// setHolders sets e.Holders from recs, the records of every live holder of
// e's key in term order (the first is the one newEntry was given), and marks
// every member that holds the key.
func (e *entry) setHolders(recs []backend.Record) {
	e.Holders = nil
	ids := make(map[string]bool, len(recs))
	for _, r := range recs {
		e.Holders = append(e.Holders, newHolder(r))
		ids[r.HolderID] = true
	}
	for i := range e.Members {
		e.Members[i].Holder = e.Members[i].Holder || ids[e.Members[i].ID]
	}
}

// warn adds the stale warnings of a held entry. fullTTL is the lease's full
// TTL when known (0 otherwise).
func (e *entry) warn(fullTTL time.Duration) {
	if !e.Held {
		return
	}
	switch {
	case e.Kind == "lock":
		// Locks do not heartbeat: only an election's holder is expected to.
	case e.LastHeartbeat == nil:
		e.Warnings = append(e.Warnings, "the holder has no live heartbeat record: it may be dead or cut off; its lease still ends only by its TTL")
	case fullTTL > 0 && *e.HeartbeatAgeSeconds > fullTTL.Seconds():
		e.Warnings = append(e.Warnings, fmt.Sprintf("the holder's last heartbeat is %s old, longer than the lease TTL", round(secs(*e.HeartbeatAgeSeconds))))
	}
	if fullTTL > 0 {
		if overdue := fullTTL - secs(e.TTLSeconds); overdue > fullTTL/2 {
			e.Warnings = append(e.Warnings, fmt.Sprintf("the lease was not renewed for %s (TTL %s): the holder may be stalled", round(overdue), round(fullTTL)))
		}
	}
}

// ms returns d in seconds, rounded to the millisecond.
func ms(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }

// secs converts seconds to a duration.
func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// round shortens d for display.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	default:
		return d.Round(time.Millisecond)
	}
}

// readEntry reads the record and members of key and, on a backend with
// shared locks (backend.Modes), every holder of it.
func readEntry(ctx context.Context, b backend.Backend, key string, timeout time.Duration) (entry, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var recp *backend.Record
	rec, err := b.Get(ctx, key)
	switch {
	case err == nil:
		recp = &rec
	case errors.Is(err, backend.ErrNotHeld):
	default:
		return entry{}, err
	}
	members, err := b.Members(ctx, key)
	if err != nil {
		return entry{}, err
	}
	e := newEntry(key, recp, members)
	if o, ok := b.(*opened); ok {
		b = o.Backend
	}
	if m, ok := b.(backend.Modes); ok && recp != nil {
		recs, err := m.Holders(ctx, key)
		if err != nil {
			return entry{}, err
		}
		e.setHolders(recs)
	}
	e.warn(0)
	return e, nil
}

// writeStatus prints e for people.
func writeStatus(w io.Writer, e entry, now time.Time) {
	tw := &table{}
	tw.row(e.Kind, e.Name)
	if !e.Held {
		tw.row("holder", "(none): nobody holds it")
	} else {
		tw.row("holder", e.Holder)
		tw.row("term", fmt.Sprint(e.Term))
		if e.Mode == backend.Shared.String() {
			mode := e.Mode
			if e.Limit > 0 {
				mode += fmt.Sprintf(" (limit %d)", e.Limit)
			}
			tw.row("mode", mode)
		}
		if e.Since != nil {
			tw.row("since", fmt.Sprintf("%s (%s ago)", e.Since.Format(time.RFC3339), round(now.Sub(*e.Since))))
		}
		tw.row("ttl", fmt.Sprintf("%s left", round(secs(e.TTLSeconds))))
		if e.LastHeartbeat != nil {
			tw.row("heartbeat", fmt.Sprintf("%s ago", round(secs(*e.HeartbeatAgeSeconds))))
		} else if e.Kind == "election" {
			tw.row("heartbeat", "none")
		}
		if len(e.Metadata) > 0 {
			keys := make([]string, 0, len(e.Metadata))
			for k := range e.Metadata {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var parts []string
			for _, k := range keys {
				parts = append(parts, k+"="+e.Metadata[k])
			}
			tw.row("metadata", strings.Join(parts, " "))
		}
	}
	if len(e.Holders) > 1 || (len(e.Holders) == 1 && e.Mode == backend.Shared.String()) {
		for i, h := range e.Holders {
			label := ""
			if i == 0 {
				label = "holders"
			}
			tw.row(label, describeHolder(h, now))
		}
	}
	if len(e.Members) == 0 && e.Kind == "election" {
		tw.row("members", "none")
	}
	for i, m := range e.Members {
		label := ""
		if i == 0 {
			label = "members"
		}
		s := fmt.Sprintf("%s (heartbeat %s ago)", m.ID, round(secs(m.AgeSeconds)))
		if m.Holder {
			s += " *holder*"
		}
		tw.row(label, s)
	}
	for _, warning := range e.Warnings {
		tw.row("WARNING", warning)
	}
	tw.write(w)
}

// table prints aligned columns.
type table struct{ rows [][]string }

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) {
	var width []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		for i, c := range r {
			if i == len(r)-1 {
				b.WriteString(c)
				break
			}
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", width[i]-len(c)+2))
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// describeHolder says who one holder is: ID, mode, term, since when, TTL
// left, metadata.
func describeHolder(h holder, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s", h.ID, h.Mode)
	if h.Limit > 0 {
		fmt.Fprintf(&b, ", limit %d", h.Limit)
	}
	fmt.Fprintf(&b, ", term %d", h.Term)
	if h.Since != nil {
		fmt.Fprintf(&b, ", since %s, %s ago", h.Since.Format(time.RFC3339), round(now.Sub(*h.Since)))
	}
	fmt.Fprintf(&b, ", %s left)", round(secs(h.TTLSeconds)))
	if md := formatMetadata(h.Metadata); md != "" {
		b.WriteString(" ")
		b.WriteString(md)
	}
	return b.String()
}

// formatMetadata returns md as "k=v k=v", sorted by key.
func formatMetadata(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+md[k])
	}
	return strings.Join(parts, " ")
}
