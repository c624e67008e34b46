package router

import (
	"github.com/kvgate/kvgate/confval"
	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/router/routerconfig"
)

// KVConfig holds every knob of the KV-aware policies (kv, kv_blocks, kv_no_load), the gateway's load
// accounting, the metrics scraper and the approximate (no-events) mode; routerconfig.KV
// documents each knob. The type lives in the leaf package routerconfig so that configs can
// compose it into the YAML schema without importing the router.
type KVConfig = routerconfig.KV

// ApproxConfig configures approximate mode (routerconfig.Approx).
type ApproxConfig = routerconfig.Approx

// DefaultKVConfig returns the documented defaults.
func DefaultKVConfig() KVConfig { return routerconfig.Default() }

// validateKV checks cfg and names every problem by its full key ("router.decode_weight").
func validateKV(cfg KVConfig) error { return confval.Prefix("router.", cfg.Validate()) }

// NewApproxIndex returns the approximate index configured by cfg (indexers.NewApproxIndex).
func NewApproxIndex(cfg ApproxConfig) *indexers.ApproxIndex {
	return indexers.NewApproxIndex(cfg.TTL.D(), cfg.BlockBudget)
}
