package etcdbackend_test

import (
	"errors"
	"maps"
	"testing"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestModesSetMetadataRewritesIntents: the intents of a lock carry its
// record, so that a conflict on an ancestor names the lock below (the
// backend.Modes contract); SetMetadata rewrites them with the entry, so the
// HeldError of an acquisition of the ancestor shows the lock below with its
// new metadata and its own key, in either mode.
func TestModesSetMetadataRewritesIntents(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	for _, m := range []backend.Mode{backend.Exclusive, backend.Shared} {
		t.Run(m.String(), func(t *testing.T) {
			req := modeRequest("t-"+m.String()+"/a/b", "below", m)
			top, mid := "t-"+m.String(), "t-"+m.String()+"/a"
			req.Ancestors = []string{top, mid}
			req.Metadata = map[string]string{"v": "1"}
			l, err := b.AcquireMode(ctx, req)
			if err != nil {
				t.Fatalf("AcquireMode: %v", err)
			}
			defer b.Release(ctx, l)
			md := map[string]string{"v": "2"}
			if err := b.SetMetadata(ctx, l, md); err != nil {
				t.Fatalf("SetMetadata: %v", err)
			}
			for _, anc := range req.Ancestors {
				_, err := b.AcquireMode(ctx, modeRequest(anc, "above", backend.Exclusive))
				var held *backend.HeldError
				if !errors.As(err, &held) {
					t.Fatalf("AcquireMode of ancestor %q: got %v, want a *HeldError", anc, err)
				}
				if len(held.Holders) != 1 {
					t.Fatalf("AcquireMode of ancestor %q: got %d holders, want 1 (the lock below)", anc, len(held.Holders))
				}
				r := held.Holders[0]
				if r.Key != req.Key || r.HolderID != "below" || r.Term != l.Term || r.Mode != m {
					t.Errorf("conflict on %q: got key %q holder %q term %d mode %v, want %q %q %d %v",
						anc, r.Key, r.HolderID, r.Term, r.Mode, req.Key, "below", l.Term, m)
				}
				if !maps.Equal(r.Metadata, md) {
					t.Errorf("conflict on %q: got metadata %v, want %v (as set after the acquisition)", anc, r.Metadata, md)
				}
			}
		})
	}
}
