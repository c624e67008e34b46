package sim

import (
	"bytes"
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/indexers"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Vectors produced by real msgspec on replicas of vLLM's event structs
// (vllm/distributed/kv_events.py): the same batch in three schema generations.
const (
	vectorMap = `93cb41d954fc40200000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920102
b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f
73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65
797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f61747465
6e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739101a66d65646975
6da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400`
	vectorArray = `93cb41d954fc40200000939cab426c6f636b53746f726564920102c098010203040506070804c0a3475055c092
c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f7665649101a34750550091b0416c6c
426c6f636b73436c656172656400`
	vectorV090 = `92cb41d954fc402000009396ab426c6f636b53746f726564920102c098010203040506070804c092ac426c6f63
6b52656d6f766564910191b0416c6c426c6f636b73436c6561726564`
	// CPU offload placeholder BlockStored.
	vectorCPUPlaceholder = `88a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf1e0b2e028ef071cbb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0`
)

// specEvents is vectorMap's batch content as the block pool would produce it.
func specEvents() []kvEvent {
	return []kvEvent{
		{kind: evStored, hashes: []uint64{1, 2}, tokens: seqTokens(1, 8), blockSize: 4, medium: mediumGPU, extra: [][]string{nil, nil}},
		{kind: evRemoved, hashes: []uint64{1}, medium: mediumGPU},
		{kind: evCleared},
	}
}

// testPublisher starts a publisher on loopback with ephemeral ports and a SUB connected to it.
func testPublisher(t *testing.T, o Options, rank int) (*publisher, *zmq.Socket) {
	t.Helper()
	o.KVEvents = KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: o.KVEvents.Topic}
	o, err := o.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPublisher(o, rank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })
	p.now = func() time.Time { return time.Unix(1700000000, 500_000_000) }
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
	if err := sub.Connect(p.endpoint); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // ZMQ slow joiner: let the subscription reach the PUB
	return p, sub
}

// publishFirst publishes events as a fresh publisher's first batch and returns what a subscriber
// received. A PUB socket drops what it sends before a subscription has reached it (ZMQ's slow
// joiner) and a loaded machine can take longer than the join pause, so a batch that never
// arrives is retried with a new publisher rather than waited for: what is compared is the bytes.
func publishFirst(t *testing.T, o Options, rank int, events []kvEvent) indexers.LiveMessage {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p, sub := testPublisher(t, o, rank)
		if err := sub.SetRcvtimeo(time.Second); err != nil {
			t.Fatal(err)
		}
		p.publish(context.Background(), events)
		frames, err := sub.RecvMessageBytes(0)
		if err != nil {
			if attempt < 5 {
				t.Logf("attempt %d: nothing received (%v); retrying with a new publisher", attempt, err)
				continue
			}
			t.Fatalf("recv after %d attempts: %v", attempt, err)
		}
		m, err := indexers.ParseLive(frames)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

func recvLive(t *testing.T, sub *zmq.Socket) indexers.LiveMessage {
	t.Helper()
	frames, err := sub.RecvMessageBytes(0)
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	m, err := indexers.ParseLive(frames)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPublisherWireVectors sends the spec's batch through the real publisher path (event
// conversion, encoder, ZMQ PUB) and compares the received frames byte for byte.
func TestPublisherWireVectors(t *testing.T) {
	tests := []struct {
		name   string
		layout indexers.Layout
		rank   int
		events []kvEvent
		want   string
	}{
		{"map v0.24+ (3.1)", indexers.LayoutMap, 0, specEvents(), vectorMap},
		{"array v0.22/0.23 (3.2)", indexers.LayoutArray, 0, specEvents(), vectorArray},
		{"v0.9.0 (3.3)", indexers.LayoutV090, 0, specEvents(), vectorV090},
		{"cpu placeholder (3.6), dp rank 1", indexers.LayoutMap, 1,
			[]kvEvent{{kind: evStored, hashes: []uint64{2164874634404590027}, medium: mediumCPU, placeholder: true}},
			"93cb41d954fc4020000091" + vectorCPUPlaceholder + "01"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := publishFirst(t, Options{Encoding: EventEncoding{Layout: tc.layout}, KVEvents: KVEventsConfig{Topic: "kv-events"}}, tc.rank, tc.events)
			if m.Topic != "kv-events" || m.Seq != 0 {
				t.Errorf("topic %q seq %d, want kv-events 0", m.Topic, m.Seq)
			}
			if want := unhex(t, tc.want); !bytes.Equal(m.Payload, want) {
				t.Errorf("payload\n got %x\nwant %x", m.Payload, want)
			}
		})
	}
}

// TestPublisherBytesHashes: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 writes 32-byte bin hashes.
func TestPublisherBytesHashes(t *testing.T) {
	m := publishFirst(t, Options{Encoding: EventEncoding{BytesHashes: true}}, 0, []kvEvent{{kind: evRemoved, hashes: []uint64{0x0102}, medium: mediumGPU}})
	want := "91c420" + strings.Repeat("00", 30) + "0102"
	if !strings.Contains(hex.EncodeToString(m.Payload), want) {
		t.Errorf("payload %x lacks bin8 hash %s", m.Payload, want)
	}
}

// TestReplay: a subscriber that lost messages (the drop fault) gets every missing batch back
// from the ROUTER socket, byte-identical, followed by the end marker, in both reply formats
// (vllm/distributed/kv_events.py, ZmqEventPublisher replay).
func TestReplay(t *testing.T) {
	for _, format := range []indexers.ReplayFormat{indexers.ReplayWithTopic, indexers.ReplayNoTopic} {
		name := map[indexers.ReplayFormat]string{indexers.ReplayWithTopic: "with topic", indexers.ReplayNoTopic: "without topic"}[format]
		t.Run(name, func(t *testing.T) {
			o := Options{Encoding: EventEncoding{Replay: format}, KVEvents: KVEventsConfig{Topic: "kv"},
				Faults: Faults{DropEventRate: 0.5, Seed: 3}}
			p, sub := testPublisher(t, o, 0)
			const n = 40
			for i := range n {
				p.publish(context.Background(), []kvEvent{{kind: evRemoved, hashes: []uint64{uint64(i)}, medium: mediumGPU}})
			}
			// Live: collect what arrives until the publisher has sent everything.
			live := map[uint64][]byte{}
			deadline := time.Now().Add(5 * time.Second)
			for p.batches.Load() < n && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if err := sub.SetRcvtimeo(300 * time.Millisecond); err != nil {
				t.Fatal(err)
			}
			for {
				frames, err := sub.RecvMessageBytes(0)
				if err != nil {
					break
				}
				m, err := indexers.ParseLive(frames)
				if err != nil {
					t.Fatal(err)
				}
				live[m.Seq] = m.Payload
			}
			dropped := int(p.dropped.Load())
			if dropped == 0 || len(live) != n-dropped {
				t.Fatalf("live got %d of %d with %d dropped; the fault should drop some", len(live), n, dropped)
			}
			first := uint64(0)
			for live[first] != nil {
				first++
			}
			replies := replay(t, p.replayEndpoint, first)
			if len(replies) != n-int(first)+1 || !replies[len(replies)-1].End {
				t.Fatalf("replay from %d returned %d replies, want %d batches + end", first, len(replies), n-int(first))
			}
			for i, r := range replies[:len(replies)-1] {
				if r.Seq != first+uint64(i) {
					t.Fatalf("reply %d has seq %d, want %d", i, r.Seq, first+uint64(i))
				}
				wantTopic := "kv"
				if format == indexers.ReplayNoTopic {
					wantTopic = ""
				}
				if r.Topic != wantTopic {
					t.Errorf("reply topic %q, want %q", r.Topic, wantTopic)
				}
				if got, ok := live[r.Seq]; ok && !bytes.Equal(got, r.Payload) {
					t.Errorf("seq %d: replayed payload differs from live", r.Seq)
				}
				want := []byte{0x91, 0x84} // one BlockRemoved map
				if !bytes.Contains(r.Payload, want) {
					t.Errorf("seq %d: payload %x is not a BlockRemoved batch", r.Seq, r.Payload)
				}
			}
		})
	}
}

// replay asks the ROUTER for every batch from start with a DEALER, as a gateway would, and
// checks the raw frame shapes of each reply.
func replay(t *testing.T, endpoint string, start uint64) []indexers.ReplayReply {
	t.Helper()
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.SetRcvtimeo(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SendMessage(indexers.ReplayRequestFrames(start)); err != nil {
		t.Fatal(err)
	}
	var out []indexers.ReplayReply
	for {
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay recv after %d replies: %v", len(out), err)
		}
		if len(frames) < 3 || len(frames[0]) != 0 {
			t.Fatalf("replay reply frames %q lack the empty delimiter", frames)
		}
		r, err := indexers.ParseReplayReply(frames)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
		if r.End {
			return out
		}
	}
}

// TestOpaqueHashIDs: opaque ids differ from the content keys and between DP ranks, while a
// later event's parent is exactly the id the earlier event announced.
func TestOpaqueHashIDs(t *testing.T) {
	evs := []kvEvent{
		{kind: evStored, hashes: []uint64{10, 11}, tokens: seqTokens(1, 8), blockSize: 4, medium: mediumGPU, extra: [][]string{nil, nil}},
		{kind: evStored, hashes: []uint64{12}, parent: 11, hasParent: true, tokens: seqTokens(9, 4), blockSize: 4, medium: mediumGPU, extra: [][]string{nil}},
		{kind: evRemoved, hashes: []uint64{11}, medium: mediumGPU},
	}
	wire := func(rank int, ids hashIDs) (stored0, stored1 *indexers.BlockStored, removed *indexers.BlockRemoved) {
		var b indexers.EventBatch
		toWire(&b, pubItem{events: evs}, rank, ids)
		return b.Events[0].(*indexers.BlockStored), b.Events[1].(*indexers.BlockStored), b.Events[2].(*indexers.BlockRemoved)
	}
	plain0, _, _ := wire(0, hashIDs{})
	if plain0.BlockHashes[0].U != 10 {
		t.Errorf("plain id %d, want the content key 10", plain0.BlockHashes[0].U)
	}
	var key0, key1 hashIDs
	key0.opaque, key1.opaque = true, true
	key1.key[0] = 1
	a0, a1, ar := wire(0, key0)
	b0, _, _ := wire(1, key1)
	if a0.BlockHashes[0].U == 10 || a0.BlockHashes[0].U == b0.BlockHashes[0].U {
		t.Errorf("opaque ids %d (rank 0) and %d (rank 1) should differ from 10 and each other", a0.BlockHashes[0].U, b0.BlockHashes[0].U)
	}
	if a1.ParentBlockHash.V.U != a0.BlockHashes[1].U || ar.BlockHashes[0].U != a0.BlockHashes[1].U {
		t.Errorf("parent %d / removal %d do not match the stored id %d", a1.ParentBlockHash.V.U, ar.BlockHashes[0].U, a0.BlockHashes[1].U)
	}
}
