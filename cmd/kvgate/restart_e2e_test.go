package main

import (
	"context"
	"testing"
	"time"
)

// A worker restarts within a second, /health never failing (sim.Worker.Restart: its prefix cache
// is gone without events, it publishes from seq 0 again, process_start_time_seconds moves on).
// The gateway un-credits the worker's blocks from the changed start time in its metrics scrape
// and the replay-ring check that follows, before the worker publishes any new event. Before,
// the lost blocks stayed credited until the worker's first new event (issue 32: 81 blocks).
func TestFastRestartUncreditedBeforeAnyEvent(t *testing.T) {
	tok := needModel(t)
	f := startFleet(t, tok, fleetSpec{workers: 1, events: true, args: []string{"--router-policy", "kv"}})
	f.awaitEvents()
	u := f.urls[0]
	req := chatRequest("You keep the restart ledger.", longText(11, 60))
	if _, err := f.client.CreateChatCompletion(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	before := f.awaitCached(req, u, nil)
	w := f.sims[u]
	batches := w.Stats().EventBatches
	started := time.Now()
	if err := w.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	for {
		d := f.dryRun(req, nil)
		if d.g1Of(u) == 0 {
			t.Logf("%d credited blocks gone %v after the restart", before.g1Of(u), time.Since(started).Round(time.Millisecond))
			break
		}
		if time.Since(started) > 5*time.Second {
			t.Fatalf("5 s after a restart the gateway still credits %s with %d of the prompt's %d blocks", u, d.g1Of(u), d.PromptBlocks)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := w.Stats().EventBatches; got != batches {
		t.Errorf("the worker published %d event batches after the restart; the test needs none", got-batches)
	}
}
