// Package configref renders the configuration reference (docs/configuration.md, printed by
// `kvgate config reference`) from the config types themselves: the YAML keys, types and
// defaults by reflection over configs.Config and configs.Default(), and each key's meaning from
// its struct field's doc comment.
//
// Doc comments are not in a compiled binary, so they are extracted from the source at
// generation time (go generate, `make docs`: ./gen with internal/fielddoc, go/parser) into
// fielddocs_gen.go, and looked up at runtime by the field's owning type. The tests fail when
// that table, docs/configuration.md or configs/kvgate.yaml no longer match the code.
package configref

//go:generate go run ./gen -root ../.. -out fielddocs_gen.go
