package router

import (
	"sync"

	"github.com/kvgate/kvgate/kvkey"
)

// perTarget is a concurrent map from target to its state, bounded at maxTimedTargets: the
// time model, the working sets and the recent-prompt rings each keep one. Reads take the read
// lock only; a target beyond the bound gets no state (callers fall back to not tracking it).
type perTarget[T any] struct {
	mu sync.RWMutex
	m  map[kvkey.Target]*T
}

func newPerTarget[T any]() *perTarget[T] {
	return &perTarget[T]{m: make(map[kvkey.Target]*T)}
}

// get is t's state, nil when it has none.
func (p *perTarget[T]) get(t kvkey.Target) *T {
	p.mu.RLock()
	v := p.m[t]
	p.mu.RUnlock()
	return v
}

// getOrCreate is t's state, made by create when t has none; nil when the map already holds
// maxTimedTargets targets or create returns nil.
func (p *perTarget[T]) getOrCreate(t kvkey.Target, create func() *T) *T {
	if v := p.get(t); v != nil {
		return v
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.m[t]; v != nil {
		return v
	}
	if len(p.m) >= maxTimedTargets {
		return nil
	}
	v := create()
	if v != nil {
		p.m[t] = v
	}
	return v
}

// all is a snapshot of every target's state, for sweeps that must not hold the map's lock.
func (p *perTarget[T]) all() []*T {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]*T, 0, len(p.m))
	for _, v := range p.m {
		out = append(out, v)
	}
	return out
}

// forget drops t's state.
func (p *perTarget[T]) forget(t kvkey.Target) {
	p.mu.Lock()
	delete(p.m, t)
	p.mu.Unlock()
}
