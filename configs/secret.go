package configs

import "github.com/kvgate/kvgate/confval"

// Masked returns a copy of c fit to print: every key tagged `secret:"true"` (API keys, the
// admin token, worker keys, NATS passwords and tokens) reads confval.Mask when set, and URLs
// lose their credentials (confval.Masked). A key whose name sounds secret must carry the tag:
// TestSecretKeysTagged fails otherwise.
func Masked(c Config) Config { return confval.Masked(c) }
