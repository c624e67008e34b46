package configs

import (
	"fmt"
	"slices"
	"strings"
)

// validateRouter checks router.policy and the KV-aware policies' knobs.
func (c *Config) validateRouter(bad func(key, format string, args ...any)) {
	r := c.Router
	switch {
	case r.Policy == "" || r.Policy == PolicyAuto:
		// Only before normalize (Validate called directly on a raw config): nothing to check.
	case !slices.Contains(Policies(), r.Policy):
		bad("router.policy", "unknown policy %q (known: auto, %s)", r.Policy, strings.Join(Policies(), ", "))
	case KVAware(r.Policy) && c.Tokenizer == "":
		why := ""
		if c.policyAuto && c.EventsWorker() >= 0 {
			why = fmt.Sprintf(" (the default because workers[%d] has kv_events)", c.EventsWorker())
		} else if c.policyAuto {
			why = fmt.Sprintf(" (the default because discovery.%s finds workers with KV events)", c.Discovery.Source())
		}
		bad("tokenizer", "is required by router.policy %s%s: the gateway must tokenize prompts to match them against the workers' caches; set tokenizer, or router.policy round_robin", r.Policy, why)
	}

	// The KV-aware policies' knobs are validated by their owner, routerconfig.KV (see Validate).
}
