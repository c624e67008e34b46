package main

import (
	"context"
	"log/slog"
	"reflect"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router"
	"github.com/kvgate/kvgate/sessions"
	"github.com/kvgate/kvgate/workers"
)

// The router's knobs are its own type, composed into the config (routerconfig.KV); the session
// keys (sessionsconfig.Config) are mapped onto sessions.Config: their documented defaults must be
// the sessions package's, and the policy names the router's.
func TestConfigMirrorsSessions(t *testing.T) {
	def := configs.Default()
	got, want := sessionsConfig(def.Sessions), sessions.Defaults()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sessions defaults drifted:\n config   %+v\n sessions %+v", got, want)
	}
	// Both configs take 0 as a value: 0 credits (--sessions-affinity-blocks 0) reach the tracker
	// as 0, which is off there too (sessions.TestZeroCreditIsOff), and are valid.
	off := def.Sessions
	off.AffinityBlocks, off.ParentBlocks = 0, 0
	if sc := sessionsConfig(off); sc.AffinityBlocks != 0 || sc.ParentBlocks != 0 || sc.Validate() != nil {
		t.Errorf("0 credits map to %v / %v (%v), want 0 and valid", sc.AffinityBlocks, sc.ParentBlocks, sc.Validate())
	}
	names := configs.Policies()
	slices.Sort(names)
	if !slices.Equal(names, router.Names()) {
		t.Errorf("config knows policies %v, router %v", names, router.Names())
	}
}

// The simple policies need no tokenizer, index or sessions; they still run in a Dispatcher so the
// gateway accounts load and reads usage the same way for every policy.
func TestBuildRoutingSimplePolicies(t *testing.T) {
	for _, name := range []string{"round_robin", "random", "least_loaded"} {
		t.Run(name, func(t *testing.T) {
			cfg := configs.Default()
			cfg.Model, cfg.Router.Policy = "m", name
			cfg.Workers = []configs.Worker{{URL: "http://127.0.0.1:1", DPSize: 2}}
			reg, err := workers.NewRegistry(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			rt, err := buildRouting(context.Background(), cfg, reg, nil, slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.close()
			if rt.dispatcher == nil || rt.dispatcher.Name() != name {
				t.Errorf("dispatcher %v", rt.dispatcher)
			}
			if rt.enricher != nil || rt.sessions != nil || rt.events != nil {
				t.Errorf("simple policy got KV parts: %+v", rt)
			}
			if got := allTargets(reg); len(got) != 2 || got[1] != (kvkey.Target{Worker: "http://127.0.0.1:1", DPRank: 1}) {
				t.Errorf("targets %v", got)
			}
		})
	}
}

// The feed passes the index's GPU residency changes to the session tracker, after the index
// applied them: stored blocks attributed to a session advance its frontier, removals recede it,
// a clear drops it; other tiers are ignored.
func TestSessionFeed(t *testing.T) {
	ix := indexers.NewIndex(indexers.Options{BlockSize: 16})
	sm, err := sessions.New(sessions.Defaults(), ix, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	feed := &sessionFeed{m: sm}
	tgt := kvkey.Target{Worker: "http://w:1"}
	// The tracker holds hashed ids; the worker echoed the client's own (a body session_id).
	sm.Observe(sessions.Identity{SessionID: kvkey.HashSessionID("s")})
	depth := func() int {
		fr := sm.Frontiers(kvkey.HashSessionID("s"))
		if len(fr) == 0 {
			return 0
		}
		return fr[0].Depth
	}
	steps := []struct {
		name string
		do   func()
		want int
	}{
		{"host-tier store ignored", func() { feed.BlocksStoredFrom(tgt, indexers.G2, []kvkey.BlockHash{11, 12}, 0, false, "s") }, 0},
		{"GPU store of blocks 0-1", func() { feed.BlocksStoredFrom(tgt, indexers.G1, []kvkey.BlockHash{11, 12}, 0, false, "s") }, 2},
		{"GPU store extending it", func() { feed.BlocksStoredFrom(tgt, indexers.G1, []kvkey.BlockHash{13, 14}, 12, true, "s") }, 4},
		{"host-tier removal ignored", func() { feed.BlocksRemoved(tgt, indexers.G2, []kvkey.BlockHash{13}) }, 4},
		{"GPU removal recedes", func() { feed.BlocksRemoved(tgt, indexers.G1, []kvkey.BlockHash{13, 14}) }, 2},
		{"clear drops", func() { feed.Cleared(tgt, false) }, 0},
	}
	for _, st := range steps {
		st.do()
		if got := depth(); got != st.want {
			t.Fatalf("%s: frontier depth %d, want %d", st.name, got, st.want)
		}
	}
}

// The feed replays a real change set of the index in order: a session's GPU store advances its
// frontier, the reset that follows drops it.
func TestSessionFeedChangeSet(t *testing.T) {
	ix := indexers.NewIndex(indexers.Options{BlockSize: 4})
	sm, err := sessions.New(sessions.Defaults(), ix, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	feed := &sessionFeed{m: sm}
	tgt := kvkey.Target{Worker: "http://w:1"}
	// The tracker holds hashed ids; the worker echoed the client's own (a body session_id).
	sm.Observe(sessions.Identity{SessionID: kvkey.HashSessionID("s")})
	var cs indexers.ChangeSet
	store := &indexers.BlockStored{BlockHashes: []indexers.WireHash{indexers.IntHash(1), indexers.IntHash(2)},
		TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, SessionID: indexers.Some("s")}
	if err := ix.ApplyTo(tgt, &indexers.EventBatch{Events: []indexers.Event{store}}, &cs); err != nil {
		t.Fatal(err)
	}
	feed.IndexChanged(&cs)
	if fr := sm.Frontiers(kvkey.HashSessionID("s")); len(fr) != 1 || fr[0].Depth != 2 {
		t.Fatalf("after the store: frontiers %+v, want one of depth 2", fr)
	}
	ix.ResetTo(tgt, &cs)
	feed.IndexChanged(&cs)
	if fr := sm.Frontiers(kvkey.HashSessionID("s")); len(fr) != 0 {
		t.Fatalf("after the reset: frontiers %+v, want none", fr)
	}
}
