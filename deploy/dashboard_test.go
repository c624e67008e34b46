package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// dashboardFile is the Grafana dashboard kvgate ships (docs/operations.md, "The Grafana
// dashboard"); the chart carries a copy.
const dashboardFile = "grafana/kvgate.json"

// grafanaPanel is the part of a dashboard panel the test reads: its queries, and a row's
// nested panels when the row is collapsed.
type grafanaPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDashboard struct {
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []query
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				qs = append(qs, query{fmt.Sprintf("panel %q query %d", p.Title, i), tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	// A template variable's label_values(METRIC, LABEL) is Grafana's, not PromQL: its metric
	// is checked as a selector.
	lv := regexp.MustCompile(`^label_values\(\s*([^,]+?)\s*,\s*\w+\s*\)$`)
	for _, v := range d.Templating.List {
		if m := lv.FindStringSubmatch(v.Definition); m != nil {
			qs = append(qs, query{fmt.Sprintf("variable %q", v.Name), m[1]})
		}
	}
	return qs
}

// grafanaVars replaces Grafana's variables with values PromQL accepts: interval variables with
// a duration, every other variable (a label value in a matcher) with a regex.
var (
	intervalVar = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)
	otherVar    = regexp.MustCompile(`\$\{?\w+\}?`)
)

func promQL(expr string) string {
	return otherVar.ReplaceAllString(intervalVar.ReplaceAllString(expr, "5m"), ".*")
}

// metricNames parses expr and returns the metric names its selectors name.
func metricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(promQL(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name != "" {
			names = append(names, name)
		}
		return nil
	})
	return names, nil
}

// TestDashboardQueriesParse: every query of the dashboard is PromQL and names a metric.
func TestDashboardQueriesParse(t *testing.T) {
	qs := dashboardQueries(t)
	if len(qs) < 20 {
		t.Fatalf("%s: %d queries, want the full dashboard", dashboardFile, len(qs))
	}
	for _, q := range qs {
		names, err := metricNames(q.expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: %q names no metric", q.where, q.expr)
		}
	}
}

// notProvoked lists the metrics the test's traffic does not make appear: failure paths (a
// metric vector shows in a scrape only once a series has a value). Each must still be
// registered by the product's source under that exact name (checked), and may not be queried
// beyond what this list explains.
var notProvoked = map[string]string{
	"kvgate_upstream_errors_total":                 "a worker failing while proxied",
	"kvgate_retries_total":                         "a worker failing before the first byte",
	"kvgate_cluster_errors_total":                  "a NATS call missing its deadline",
	"kvgate_discovery_errors_total":                "a discovery source failing",
	"kvgate_router_prompt_token_mismatches_total":  "a worker counting prompt tokens differently",
	"kvgate_router_cache_regret_blocks_total":      "a decision choosing less cache than the best candidate (load)",
	"kvgate_router_duplicate_prefill_tokens_total": "a prefix prefilled twice at once",
	"kvgate_flow_queue_requests":                   "a request waiting in the gateway's queue",
	"kvgate_flow_queue_bytes":                      "a request waiting in the gateway's queue",
	"kvgate_flow_shed_total":                       "a request shed from the gateway's queue",
	"kvgate_flow_wait_seconds":                     "a request waiting in the gateway's queue",
}

// TestDashboardMetricsExported: every metric a panel queries is one that a running kvgate (or,
// for the vllm: series, a worker) exports: a gateway in front of simulated workers, with the
// admin listener (the per-worker series), an embedded NATS server (the cluster series) and DNS
// discovery of one worker (the discovery series), after streamed traffic sharing a prefix.
func TestDashboardMetricsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway and simulated workers")
	}
	qs := dashboardQueries(t)
	families := runGatewayAndScrape(t)

	source := productSource(t)
	missing := map[string][]string{}
	for _, q := range qs {
		names, err := metricNames(q.expr)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		for _, n := range names {
			if exported(families, n) {
				continue
			}
			base := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suf)
			}
			if _, ok := notProvoked[base]; ok && strings.Contains(source, `"`+base+`"`) {
				continue
			}
			missing[n] = append(missing[n], q.where)
		}
	}
	var ms []string
	for n := range missing {
		ms = append(ms, n)
	}
	sort.Strings(ms)
	for _, n := range ms {
		t.Errorf("%s is queried (%s) but not exported by the running gateway or worker", n, strings.Join(missing[n], "; "))
	}
	if t.Failed() {
		var have []string
		for n := range families {
			have = append(have, n)
		}
		sort.Strings(have)
		t.Logf("exported: %s", strings.Join(have, " "))
	}
}

// productSource is the product module's Go source (not its tests, not this module), where
// the metrics are registered by name.
func productSource(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == filepath.Join("..", "deploy") || strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			b.Write(src)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// exported: name is a family of the scrape, or a histogram's _bucket, _sum or _count series.
func exported(families map[string]*dto.MetricFamily, name string) bool {
	if _, ok := families[name]; ok {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if f, ok := families[base]; ok && (f.GetType() == dto.MetricType_HISTOGRAM ||
				suf != "_bucket" && f.GetType() == dto.MetricType_SUMMARY) {
				return true
			}
		}
	}
	return false
}

// repoBinary returns the binary of ./cmd/NAME: $ENV when set (make test points it at the one it
// built), else one built here from the repository root.
func repoBinary(t *testing.T, env, name string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	bin := filepath.Join(t.TempDir(), name)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	return bin
}

// freePorts returns n loopback ports free when asked.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// freeBlock returns a base port whose next span ports are all free (vllm-sim fleet numbers its
// workers' ports from a base).
func freeBlock(t *testing.T, span int) int {
	t.Helper()
	for base := 31000 + os.Getpid()%400*20; base < 60000; base += 997 {
		ok := true
		for p := base; p < base+span && ok; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port block")
	return 0
}

// start runs a process until the test ends; its output goes to a log file kept on failure.
func start(t *testing.T, logName, bin string, args ...string) *exec.Cmd {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), logName))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = withoutKVGATE(os.Environ())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("%s:\n%s", logName, lastLines(b, 30))
			}
		}
	})
	return cmd
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitOK polls url until it answers 200.
func waitOK(t *testing.T, url string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 within %s", url, within)
}

// runGatewayAndScrape starts two simulated workers and two gateways (A: the workers as a static
// list, KV routing, an embedded NATS server; B: worker 1 found by DNS discovery of localhost),
// sends A streamed chat requests that share a long prefix, several at once (holds, duplicate
// prefill, regret), and returns the metric families of both admin listeners and worker 1.
func runGatewayAndScrape(t *testing.T) map[string]*dto.MetricFamily {
	kvgate := repoBinary(t, "KVGATE_BIN", "kvgate")
	sim := repoBinary(t, "VLLM_SIM_BIN", "vllm-sim")
	tokenizer, err := filepath.Abs("../models/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tokenizer, "tokenizer.json")); err != nil {
		t.Fatalf("the qwen3 tokenizer is missing (scripts/setup.sh fetches it): %v", err)
	}
	dir := t.TempDir()
	base := freeBlock(t, 140)
	ports := freePorts(t, 5)
	gwA, adminA, natsA, gwB, adminB := ports[0], ports[1], ports[2], ports[3], ports[4]
	fleetCfg := filepath.Join(dir, "fleet.yaml")
	start(t, "fleet.log", sim, "fleet", "--workers", "2", "--host", "127.0.0.1",
		"--base-port", fmt.Sprint(base+1), "--events-base-port", fmt.Sprint(base+100),
		"--model", tokenizer, "--served-model-name", "qwen3", "--block-size", "16",
		"--num-gpu-blocks", "4096", "--speedup", "1", "--gateway-listen", fmt.Sprintf("127.0.0.1:%d", gwA),
		"--router-policy", "kv", "--config-out", fleetCfg, "--log-level", "warn")
	for i := 1; i <= 2; i++ {
		waitOK(t, fmt.Sprintf("http://127.0.0.1:%d/health", base+i), time.Minute)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(fleetCfg); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("vllm-sim fleet wrote no config")
		}
		time.Sleep(100 * time.Millisecond)
	}
	cfg, err := os.ReadFile(fleetCfg)
	if err != nil {
		t.Fatal(err)
	}
	// Worker 1's event and replay endpoints, as the fleet wrote them.
	m := regexp.MustCompile(`kv_events: tcp://127\.0\.0\.1:(\d+)\s+replay: tcp://127\.0\.0\.1:(\d+)`).FindStringSubmatch(string(cfg))
	if m == nil {
		t.Fatalf("no kv_events/replay in the fleet config:\n%s", cfg)
	}
	start(t, "gateway-a.log", kvgate, "serve", "--config", fleetCfg,
		"--listen", fmt.Sprintf("127.0.0.1:%d", gwA), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", adminA),
		"--cluster-replica-id", "gwa", "--cluster-embedded-nats-listen", fmt.Sprintf("127.0.0.1:%d", natsA),
		"--cluster-embedded-nats-store-dir", filepath.Join(dir, "jetstream"), "--flow-control-enabled",
		"--log-level", "warn")
	start(t, "gateway-b.log", kvgate, "serve", "--model", "qwen3", "--tokenizer", tokenizer, "--block-size", "16",
		"--listen", fmt.Sprintf("127.0.0.1:%d", gwB), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", adminB),
		"--discovery-dns-name", "localhost", "--discovery-dns-port", fmt.Sprint(base+1),
		"--discovery-dns-kv-events-port", m[1], "--discovery-dns-replay-port", m[2],
		"--discovery-dns-interval", "1s", "--auth-api-keys", "key-b", "--log-level", "warn")
	waitOK(t, fmt.Sprintf("http://127.0.0.1:%d/health", gwA), time.Minute)
	waitOK(t, fmt.Sprintf("http://127.0.0.1:%d/live", gwB), time.Minute)
	waitOK(t, fmt.Sprintf("http://127.0.0.1:%d/ready", gwB), time.Minute)

	// Traffic: rounds of concurrent streamed requests sharing a ~3k-token system prompt, each
	// with its own question; then one for an unknown model (a 404 by code).
	system := strings.Repeat("You are a careful assistant for the kvgate project; answer briefly and cite the docs. ", 150)
	urlA := fmt.Sprintf("http://127.0.0.1:%d", gwA)
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- streamChat(urlA, "", "qwen3", system, fmt.Sprintf("question %d of round %d", i, round), false)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	urlB := fmt.Sprintf("http://127.0.0.1:%d", gwB)
	if err := streamChat(urlB, "key-b", "qwen3", system, "through discovery", false); err != nil {
		t.Fatal(err)
	}
	if err := streamChat(urlB, "wrong-key", "qwen3", "", "hello", false); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a wrong key: %v, want a 401", err)
	}
	if err := streamChat(urlA, "", "no-such-model", "", "hello", false); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("unknown model: %v, want a 404", err)
	}
	if err := streamChat(urlA, "", "qwen3", system, "gone after the first event", true); err != nil {
		t.Fatal(err)
	}
	// The gateway counts the disconnect once it notices the client gone.
	waitMetric(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", adminA), "kvgate_client_disconnects_total", 10*time.Second)

	families := map[string]*dto.MetricFamily{}
	for _, u := range []string{
		fmt.Sprintf("http://127.0.0.1:%d/metrics", adminA),
		fmt.Sprintf("http://127.0.0.1:%d/metrics", adminB),
		fmt.Sprintf("http://127.0.0.1:%d/metrics", base+1),
	} {
		for n, f := range scrape(t, u) {
			families[n] = f
		}
	}
	return families
}

// waitMetric polls a /metrics until it has family name.
func waitMetric(t *testing.T, url, name string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, ok := scrape(t, url)[name]; ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %s", url, name, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// streamChat sends one streamed chat completion with usage (with key as the bearer token when
// set) and reads the stream to its end, or, with hangUp, goes away after the first event.
func streamChat(base, key, model, system, user string, hangUp bool) error {
	msgs := []map[string]string{{"role": "user", "content": user}}
	if system != "" {
		msgs = append([]map[string]string{{"role": "system", "content": system}}, msgs...)
	}
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": 8,
		"stream_options": map[string]bool{"include_usage": true}, "messages": msgs})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s %s: %s: %s", model, user, resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for sc.Scan() {
		if hangUp && strings.HasPrefix(sc.Text(), "data: ") {
			return nil // the deferred cancel and Close hang up mid-stream
		}
		if sc.Text() == "data: [DONE]" {
			done = true
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !done {
		return fmt.Errorf("%s %s: the stream ended without [DONE]", model, user)
	}
	return nil
}

// scrape reads url's Prometheus text exposition.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return fs
}
