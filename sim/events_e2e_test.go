package sim

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/indexers"
)

// subscribe connects a SUB to endpoint and waits out the slow-joiner window.
func subscribe(t *testing.T, endpoint string) *zmq.Socket {
	t.Helper()
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.SetSubscribe(""); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetRcvtimeo(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(strings.Replace(endpoint, "0.0.0.0", "127.0.0.1", 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	return sub
}

// decodeNext receives one live message and decodes its batch.
func decodeNext(t *testing.T, sub *zmq.Socket) (indexers.LiveMessage, *indexers.EventBatch) {
	t.Helper()
	m := recvLive(t, sub)
	b, err := indexers.DecodeBatch(m.Payload)
	if err != nil {
		t.Fatalf("decode seq %d: %v", m.Seq, err)
	}
	return m, b
}

func post(t *testing.T, url, body string, hdr map[string]string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestEventsOverHTTP: requests produce BlockStored events with the X-Session-ID attribution,
// DP rank r publishes on its own socket with data_parallel_rank r, and POST
// /reset_prefix_cache publishes AllBlocksCleared.
func TestEventsOverHTTP(t *testing.T) {
	w, base := startWorker(t, Options{ServedModelName: "m", BlockSize: 4, DataParallelSize: 2,
		TTFT: time.Millisecond, ITL: time.Millisecond,
		KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv"}})
	eps := w.EventEndpoints()
	if len(eps) != 2 || eps[0].Endpoint == eps[1].Endpoint {
		t.Fatalf("endpoints %+v, want one per DP rank", eps)
	}
	subs := []*zmq.Socket{subscribe(t, eps[0].Endpoint), subscribe(t, eps[1].Endpoint)}
	body := `{"model":"m","prompt":"one two three four five six seven eight nine","max_tokens":1}`
	for rank, sub := range subs {
		hdr := map[string]string{"X-Session-ID": "sess-" + itoa(rank), "X-data-parallel-rank": itoa(rank)}
		if st := post(t, base+"/v1/completions", body, hdr); st != 200 {
			t.Fatalf("rank %d: status %d", rank, st)
		}
		m, b := decodeNext(t, sub)
		if m.Topic != "kv" || m.Seq != 0 || !b.DPRank.Set || b.DPRank.V != int64(rank) || len(b.Events) != 1 {
			t.Fatalf("rank %d: message %+v batch %+v", rank, m, b)
		}
		s, ok := b.Events[0].(*indexers.BlockStored)
		if !ok || len(s.BlockHashes) != 2 || len(s.TokenIDs) != 8 || s.SessionID.V != "sess-"+itoa(rank) || s.Medium.V != "GPU" {
			t.Errorf("rank %d: event %+v, want 2 blocks attributed to sess-%d", rank, b.Events[0], rank)
		}
	}
	if st := post(t, base+"/reset_prefix_cache", "", nil); st != 200 {
		t.Fatalf("reset: status %d", st)
	}
	for rank, sub := range subs {
		m, b := decodeNext(t, sub)
		if _, ok := b.Events[0].(*indexers.AllBlocksCleared); !ok || m.Seq != 1 || len(b.Events) != 1 {
			t.Errorf("rank %d: after reset got seq %d %+v, want AllBlocksCleared", rank, m.Seq, b.Events)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
