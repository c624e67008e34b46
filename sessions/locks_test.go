package sessions

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvkey"
)

// Hint lookups read the hint table only: while event application holds the state lock (here
// held by the test), Hints still answers, with the affinity published before.
func TestHintsDoNotWaitForEventApplication(t *testing.T) {
	m, err := New(Defaults(), newFakeIndex(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tg := kvkey.Target{Worker: "http://w:1"}
	m.Observe(Identity{SessionID: "s"})
	m.OnRouted("s", tg, nil)
	m.mu.Lock() // an event batch being applied
	done := make(chan []Hint, 1)
	go func() { done <- m.Hints("s", "") }()
	select {
	case hs := <-done:
		m.mu.Unlock()
		if len(hs) != 1 || hs[0].Target != tg || hs[0].Rule != RuleAffinity {
			t.Fatalf("hints %+v, want affinity to %v", hs, tg)
		}
	case <-time.After(2 * time.Second):
		m.mu.Unlock()
		t.Fatal("Hints waited for the state lock held by event application")
	}
}

// Concurrent hint lookups during event application and routing are race-free, and the hint
// table ends up agreeing with the state.
func TestConcurrentHintsDuringApply(t *testing.T) {
	m, err := New(Defaults(), newFakeIndex(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tA, tB := kvkey.Target{Worker: "http://a:1"}, kvkey.Target{Worker: "http://b:1"}
	m.Observe(Identity{SessionID: "p"})
	m.Observe(Identity{SessionID: "c", ParentID: "p"})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					_ = m.Hints("c", "p")
					_ = m.HintsWithPrefix("c", "p", []kvkey.BlockHash{1, 2})
					_ = m.Stats()
				}
			}
		})
	}
	for i := range 300 {
		tg := []kvkey.Target{tA, tB}[i%2]
		h := kvkey.BlockHash(i*2 + 1)
		if err := m.ApplyStored(tg, []kvkey.BlockHash{h, h + 1}, 0, "p"); err != nil {
			t.Fatal(err)
		}
		m.ApplyRemoved(tg, []kvkey.BlockHash{h + 1})
		if i%50 == 49 {
			m.ApplyCleared(tg)
		}
	}
	close(stop)
	wg.Wait()
	if err := m.ApplyStored(tA, []kvkey.BlockHash{9001, 9002}, 0, "p"); err != nil {
		t.Fatal(err)
	}
	hs := m.Hints("c", "p")
	if len(hs) == 0 || hs[0].Target != tA || hs[0].Rule != RuleParent {
		t.Fatalf("hints %+v, want the parent's most recent frontier %v first", hs, tA)
	}
}
