package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/cluster"
	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/server"
	"github.com/kvgate/kvgate/tokenize"
	"github.com/kvgate/kvgate/workers"
	"github.com/kvgate/kvgate/workers/discovery"
)

// modelPool is one served model as `kvgate serve` runs it: its fleet (registry and health
// probes) and its routing (index, load, sessions, latency fit, enricher), none of it shared
// with another model.
type modelPool struct {
	cfg  configs.Pool
	reg  *workers.Registry
	rt   *routing
	disc discovery.Source // nil: the static workers only
}

// pools are every served model's pool, in configured order (the first is the default model).
type pools struct {
	list  []*modelPool
	close func()
}

// buildPools builds one pool per served model (configs.Config.Pools). Tokenizers named by a
// Hugging Face model id are fetched first (fetchTokenizer). Each pool's routing metrics carry
// the label model=<name> (poolMetrics), so two pools' series never collide.
// Nothing is probed yet (see run).
func buildPools(ctx context.Context, cfg configs.Config, prom prometheus.Registerer, log *slog.Logger, node *cluster.Node) (*pools, error) {
	return buildPoolsWith(ctx, cfg, prom, log, node, loadTokenizer)
}

// buildPoolsWith is buildPools with each pool's tokenizer loaded by load (see buildRoutingWith).
func buildPoolsWith(ctx context.Context, cfg configs.Config, prom prometheus.Registerer, log *slog.Logger, node *cluster.Node, load tokenizerLoader) (ps *pools, err error) {
	built := &pools{}
	built.close = func() {
		for i := len(built.list) - 1; i >= 0; i-- {
			built.list[i].rt.close()
			built.list[i].reg.Close()
		}
	}
	defer func() {
		if err != nil {
			built.close() // a failed return has already set ps to nil
		}
	}()
	var metrics *poolMetrics
	if prom != nil {
		metrics = newPoolMetrics(prom)
	}
	for _, pc := range cfg.Pools() {
		plog := log.With("model", pc.Model)
		if pc.Tokenizer, err = fetchTokenizer(ctx, pc.Tokenizer, plog); err != nil {
			return nil, fmt.Errorf("%s: %w", poolKey(pc, "tokenizer"), err)
		}
		reg, err := workers.NewRegistry(pc.Config, plog)
		if err != nil {
			return nil, err
		}
		var preg prometheus.Registerer
		if metrics != nil {
			preg = metrics.forPool(pc.Model)
		}
		rt, err := buildRoutingWith(ctx, pc.Config, reg, preg, plog, node, load)
		if err != nil {
			reg.Close()
			return nil, err
		}
		if e, ok := rt.enricher.(*enricher); ok {
			e.baseNames = pc.Names()
		}
		mp := &modelPool{cfg: pc, reg: reg, rt: rt}
		built.list = append(built.list, mp)
		// The model's discovery source (models[].discovery, or the top-level one in the
		// single-model form) adds and removes this pool's workers only.
		dreg := preg
		if dreg == nil {
			dreg = prometheus.NewRegistry() // no metrics wanted: a registry nobody reads
		}
		if mp.disc, err = newDiscovery(pc.Config, reg, dreg, plog); err != nil {
			return nil, fmt.Errorf("%s: %w", poolKey(pc, "discovery"), err)
		}
	}
	return built, nil
}

// poolKey is the config key of a model-scoped key in pool p ("models[1].tokenizer").
func poolKey(p configs.Pool, key string) string {
	if p.Key == "" {
		return key
	}
	return p.Key + "." + key
}

// probe probes every pool's fleet once (the gateway knows its fleet before the first request),
// then keeps probing each every health.interval until ctx ends, and starts the pools'
// discovery sources (call it once every membership listener is registered: routing, server
// metrics).
func (ps *pools) probe(ctx context.Context) {
	for _, p := range ps.list {
		p.reg.ProbeAll(ctx)
		go p.reg.Run(ctx)
		if p.disc != nil {
			go p.disc.Run(ctx)
		}
	}
}

// forgetRemovedWorkers drops each pool's removed workers from the server's metrics.
func (ps *pools) forgetRemovedWorkers(srv *server.Server) {
	for _, p := range ps.list {
		forgetRemovedWorkers(p.reg, srv)
	}
}

// serverPools are the pools as the server picks among them.
func (ps *pools) serverPools() []server.Pool {
	out := make([]server.Pool, 0, len(ps.list))
	for _, p := range ps.list {
		out = append(out, server.Pool{Model: p.cfg.Model, Aliases: p.cfg.Aliases, BlockSize: p.cfg.BlockSize,
			Registry: p.reg, Router: p.rt.dispatcher, Enricher: p.rt.enricher})
	}
	return out
}

// A silent subscription is a warning on GET /ready, never a 503.
var _ server.AdvisoryCheck = (*indexers.Subscribers)(nil)

// readiness is what holds the gateway out of service per pool besides the server's own check
// that every model has a routable worker: the shared bindings' bucket, the discovery source
// until it has synced, the KV-event subscriptions.
func (ps *pools) readiness() []server.ReadinessCheck {
	var out []server.ReadinessCheck
	for _, p := range ps.list {
		if p.rt.bindings != nil {
			out = append(out, p.rt.bindings) // a deleted bucket holds the replica out until recreated
		}
		if p.disc != nil {
			out = append(out, p.disc)
		}
		if p.rt.events != nil {
			out = append(out, p.rt.events) // a subscription silent while its worker serves
		}
	}
	return out
}

// healthDetails are the pools' parts /health reports besides the workers (the cluster's
// shared bindings).
func (ps *pools) healthDetails() []server.HealthDetail {
	var out []server.HealthDetail
	for _, p := range ps.list {
		if p.rt.bindings != nil {
			out = append(out, p.rt.bindings)
		}
	}
	return out
}

// fetchTokenizer returns dir unchanged when it is a folder (or ""); a Hugging Face model id
// (org/name) is fetched from the hub into its cache (HF_ENDPOINT, HF_TOKEN, HF_HOME, as
// huggingface_hub reads them) and its snapshot folder returned. Only the files the tokenizer
// reads are fetched (tokenize.DownloadTokenizer); a cached snapshot serves when the hub is
// unreachable.
func fetchTokenizer(ctx context.Context, dir string, log *slog.Logger) (string, error) {
	if dir == "" {
		return "", nil
	}
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return dir, nil
	}
	if !configs.IsHubModelID(dir) {
		return "", fmt.Errorf("%q is not a folder", dir)
	}
	start := time.Now()
	folder, err := tokenize.DownloadTokenizer(ctx, dir, tokenize.HubOptions{})
	if err != nil {
		return "", fmt.Errorf("%s is not a folder and could not be fetched from the Hugging Face hub: %w", dir, err)
	}
	log.Info("tokenizer fetched from the hub", "repo", dir, "folder", folder, "took", time.Since(start).Round(time.Millisecond))
	return folder, nil
}
