package workers

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/configs"
)

// Membership changes, as passed to Registry.OnMembership.
const (
	// MemberAdded: a worker joined the fleet (routable until its first failed probe).
	MemberAdded = "added"
	// MemberDraining: the worker takes no new requests; in-flight ones finish, its index stays.
	MemberDraining = "draining"
	// MemberUndrained: a draining worker is routable again (its endpoint became ready).
	MemberUndrained = "undrained"
	// MemberRemoved: the worker left the fleet; everything kept about it must go.
	MemberRemoved = "removed"
)

// MemberEvent is one membership change of one worker.
type MemberEvent struct {
	Kind   string
	Worker *Worker
}

// OnMembership registers fn to hear every membership change (MemberAdded, MemberDraining,
// MemberUndrained, MemberRemoved), in order, synchronously on the goroutine that made it. fn
// must not change membership itself. Register every listener before a discovery source starts.
func (r *Registry) OnMembership(fn func(MemberEvent)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onMember = append(r.onMember, fn)
}

func (r *Registry) notifyMember(kind string, w *Worker) {
	r.mu.RLock()
	fns := append([]func(MemberEvent){}, r.onMember...)
	r.mu.RUnlock()
	for _, fn := range fns {
		fn(MemberEvent{Kind: kind, Worker: w})
	}
}

// Add puts a new worker into the fleet and tells the listeners (MemberAdded). draining adds
// it out of rotation (an endpoint listed but not ready). The URL must not be in the fleet.
func (r *Registry) Add(wc configs.Worker, draining bool) (*Worker, error) {
	wc.URL = strings.TrimRight(strings.TrimSpace(wc.URL), "/")
	wc.DPSize = max(wc.DPSize, 1)
	r.memberMu.Lock()
	defer r.memberMu.Unlock()
	w, err := r.newWorker(wc)
	if err != nil {
		return nil, err
	}
	w.draining.Store(draining)
	r.mu.Lock()
	if _, dup := r.byURL[wc.URL]; dup {
		r.mu.Unlock()
		return nil, fmt.Errorf("workers: %q is already in the fleet", wc.URL)
	}
	r.workers = append(r.workers, w)
	r.byURL[wc.URL] = w
	r.mu.Unlock()
	r.log.Info("worker added", "worker", wc.URL, "dp_size", wc.DPSize, "kv_events", wc.KVEvents != "", "draining", draining)
	r.notifyMember(MemberAdded, w)
	if draining {
		r.notifyMember(MemberDraining, w)
	}
	return w, nil
}

// SetDraining takes a worker out of rotation (true) or puts it back (false) and tells the
// listeners when that changed its state. It reports whether the worker is in the fleet.
func (r *Registry) SetDraining(url string, draining bool) bool {
	r.memberMu.Lock()
	defer r.memberMu.Unlock()
	w := r.Get(url)
	if w == nil {
		return false
	}
	if w.draining.Swap(draining) == draining {
		return true
	}
	kind := MemberUndrained
	if draining {
		kind = MemberDraining
	}
	r.log.Info("worker "+kind, "worker", url, "in_flight", w.inFlightTotal())
	r.notifyMember(kind, w)
	return true
}

// Remove takes a worker out of the fleet and tells the listeners (MemberRemoved), which drop
// its subscriptions, index, load, sessions and metric series. Requests already sent to it
// finish; its pooled connections close once they have. It reports whether it was there.
func (r *Registry) Remove(url string) bool {
	r.memberMu.Lock()
	defer r.memberMu.Unlock()
	r.mu.Lock()
	w := r.byURL[url]
	if w == nil {
		r.mu.Unlock()
		return false
	}
	delete(r.byURL, url)
	r.workers = slices.DeleteFunc(r.workers, func(x *Worker) bool { return x == w })
	r.mu.Unlock()
	w.remove()
	r.log.Info("worker removed", "worker", url, "in_flight", w.inFlightTotal())
	r.notifyMember(MemberRemoved, w)
	return true
}
