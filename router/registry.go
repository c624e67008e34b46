package router

import (
	"fmt"
	"sort"
	"strings"
)

// Options carries what policies may need at construction.
type Options struct {
	// Seed seeds the random policy; 0 draws a seed.
	Seed uint64
	// KV configures the KV-aware policies (kv, kv_blocks, kv_no_load); zero means DefaultKVConfig().
	KV KVConfig
	// KVDeps are the KV-aware policies' collaborators (index matcher, event health, approximate
	// index, load tracker, session hints); any may be nil (see KVDeps).
	KVDeps KVDeps
}

// Factory builds a policy from options.
type Factory func(Options) (Policy, error)

// factories lists the policies New knows. A new policy adds its line here.
func factories() map[string]Factory {
	return map[string]Factory{
		"round_robin":  func(Options) (Policy, error) { return &RoundRobin{}, nil },
		"random":       func(o Options) (Policy, error) { return NewRandom(o.Seed), nil },
		"least_loaded": func(Options) (Policy, error) { return &LeastLoaded{}, nil },
		PolicyKV:       func(o Options) (Policy, error) { return kvPolicy(NewKV(o.KV, o.KVDeps)) },
		PolicyKVNoLoad: func(o Options) (Policy, error) { return kvPolicy(NewKVNoLoad(o.KV, o.KVDeps)) },
		PolicyKVBlocks: func(o Options) (Policy, error) { return kvPolicy(NewKVBlocks(o.KV, o.KVDeps)) },
	}
}

// kvPolicy keeps a failed constructor from returning a non-nil Policy holding a nil pointer.
func kvPolicy(p *KVPolicy, err error) (Policy, error) {
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Names lists the known policy names, sorted.
func Names() []string {
	var names []string
	for n := range factories() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// New builds the policy called name.
func New(name string, opts Options) (Policy, error) {
	f, ok := factories()[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return f(opts)
}

// Build builds the policy called name and the Dispatcher that runs it: a KV-aware policy goes into
// eo.KV, any other into eo.Policy (whatever eo held there is replaced). Errors building the
// policy are New's (an unknown name) or the KV policy's (its config).
func Build(name string, o Options, eo DispatcherOptions) (*Dispatcher, error) {
	eo.Policy, eo.KV = nil, nil
	var err error
	switch name {
	case PolicyKV:
		eo.KV, err = NewKV(o.KV, o.KVDeps)
	case PolicyKVNoLoad:
		eo.KV, err = NewKVNoLoad(o.KV, o.KVDeps)
	case PolicyKVBlocks:
		eo.KV, err = NewKVBlocks(o.KV, o.KVDeps)
	default:
		eo.Policy, err = New(name, o)
	}
	if err != nil {
		return nil, err
	}
	return NewDispatcher(eo)
}
