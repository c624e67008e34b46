package sim

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/tokenize"
)

// BenchmarkWorker measures what one vllm-sim process sustains: streamed chat requests from 64
// concurrent clients (32 conversations sharing a system prompt, so there are prefix hits,
// new blocks and evictions), KV events published on ZMQ and drained by a subscriber. Run with
// -cpu 1 for the one-core figure. Reported: req/s, events/s, output tok/s, and cpu-util = CPU
// time of the whole test process (clients included) per wall second.
func BenchmarkWorker(b *testing.B) {
	for _, speedup := range []float64{1, 1000, 1e6} {
		b.Run(fmt.Sprintf("speedup=%g", speedup), func(b *testing.B) { benchWorker(b, speedup) })
	}
}

func benchWorker(b *testing.B, speedup float64) {
	o := Options{ServedModelName: "m", Speedup: speedup, NumGPUBlocks: 2048, MaxNumSeqs: 256,
		KVEvents: KVEventsConfig{EnableKVCacheEvents: true, Endpoint: "tcp://127.0.0.1:*"}}
	_, file, _, _ := runtime.Caller(0)
	if dir := filepath.Join(filepath.Dir(file), "..", "models", "qwen3"); fileExists(filepath.Join(dir, "tokenizer.json")) {
		t, err := tokenize.Load(dir, tokenize.Options{})
		if err != nil {
			b.Fatal(err)
		}
		o.Tokenize = t
	}
	w, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	srv := &http.Server{Handler: w.Handler()}
	ln, err := netListen()
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()

	var received atomic.Int64
	stop := make(chan struct{})
	var subWG sync.WaitGroup
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetSubscribe("")
	_ = sub.SetRcvtimeo(50 * time.Millisecond)
	_ = sub.Connect(w.EventEndpoints()[0].Endpoint)
	subWG.Add(1)
	go func() {
		defer subWG.Done()
		defer sub.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := sub.RecvMessageBytes(0); err == nil {
				received.Add(1)
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)

	system := strings.Repeat("You are a careful assistant for the kvgate benchmark; answer briefly and precisely. ", 12)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	var next atomic.Int64
	var failed atomic.Int64
	const clients = 64
	before := w.Stats()
	cpu0 := cpuTime()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":16,"ignore_eos":true,"messages":[{"role":"system","content":%q},{"role":"user","content":"conversation %d turn %d: what next?"}]}`,
					system, c%32, i)
				resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := cpuTime() - cpu0
	time.Sleep(100 * time.Millisecond)
	close(stop)
	subWG.Wait()
	after := w.Stats()
	if failed.Load() > 0 {
		b.Fatalf("%d requests failed", failed.Load())
	}
	sec := elapsed.Seconds()
	b.ReportMetric(float64(b.N)/sec, "req/s")
	b.ReportMetric(float64(after.Events-before.Events)/sec, "events/s")
	b.ReportMetric(float64(after.EventBatches-before.EventBatches)/sec, "batches/s")
	b.ReportMetric(float64(b.N*16)/sec, "out-tok/s")
	b.ReportMetric(cpu.Seconds()/sec, "cpu-util")
	if received.Load() == 0 && after.EventBatches > before.EventBatches {
		b.Error("subscriber received no events")
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
