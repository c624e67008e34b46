// Package configs owns the kvgate YAML config schema: defaults, validation with precise
// messages, and the flag and KVGATE_* environment overrides applied on top of the file.
package configs
