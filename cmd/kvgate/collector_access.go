package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/kvgate/kvgate/indexers"
	"github.com/kvgate/kvgate/indexers/eventsconfig"
)

// collectorAccess is who may publish to the collector (kv_events.allow, check_sender and the
// CURVE keys). Discovered workers' addresses are the configured workers' for now: the hook is
// CollectorAccess.Addresses, which a discovery source fills with each worker's pod addresses.
func collectorAccess(c eventsconfig.Config) (*indexers.CollectorAccess, error) {
	allow, err := c.AllowPrefixes()
	if err != nil {
		return nil, fmt.Errorf("kv_events.allow: %w", err)
	}
	acc := &indexers.CollectorAccess{Allow: allow, MatchSender: c.CheckSender, CurveClientKeys: c.CurveClientKeys}
	if c.CurveSecretKeyFile != "" {
		b, err := os.ReadFile(c.CurveSecretKeyFile)
		if err != nil {
			return nil, fmt.Errorf("kv_events.curve_secret_key_file: %w", err)
		}
		if acc.CurveSecretKey = strings.TrimSpace(string(b)); len(acc.CurveSecretKey) != 40 {
			return nil, fmt.Errorf("kv_events.curve_secret_key_file: %s does not hold a Z85 secret key (40 characters)", c.CurveSecretKeyFile)
		}
	}
	return acc, nil
}
