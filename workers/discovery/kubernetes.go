package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/configs"
	"github.com/kvgate/kvgate/workers"
	"github.com/kvgate/kvgate/workers/discoveryconfig"
)

const sourceKubernetes = "kubernetes"

// kubernetes follows the EndpointSlices of one Service: list, then watch from the list's
// resourceVersion (with bookmarks); a 410, an ERROR event or a severed watch lists again, and
// the re-list replaces what was known (a slice missing from it is gone).
type kubernetes struct {
	cfg    discoveryconfig.Kubernetes
	client *kubeClient
	rec    *reconciler
	o      Options
	syncState

	slices map[string]endpointSlice // by name; touched by Run's goroutine only
	warned map[string]bool          // slices already warned about (no event port, bad ranks)
}

func newKubernetes(cfg discoveryconfig.Kubernetes, reg *workers.Registry, o Options) (*kubernetes, error) {
	apiURL := cfg.APIURL
	if apiURL == "" {
		host, port := o.Getenv("KUBERNETES_SERVICE_HOST"), o.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("discovery.kubernetes: KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod?): set discovery.kubernetes.api_url")
		}
		apiURL = "https://" + net.JoinHostPort(host, port)
	}
	if cfg.Namespace == "" {
		b, err := os.ReadFile(discoveryconfig.NamespaceFile)
		if err != nil {
			return nil, fmt.Errorf("discovery.kubernetes.namespace is empty and the pod's namespace is unknown: %w", err)
		}
		cfg.Namespace = strings.TrimSpace(string(b))
	}
	client, err := newKubeClient(apiURL, cfg.Namespace, cfg.Service, cfg.TokenFile, cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("discovery.kubernetes.%w", err)
	}
	k := &kubernetes{cfg: cfg, client: client, o: o, rec: newReconciler(sourceKubernetes, reg, o.Metrics, o.Log),
		syncState: syncState{name: "discovery.kubernetes"},
		slices:    map[string]endpointSlice{}, warned: map[string]bool{}}
	return k, nil
}

// Run lists and watches until ctx ends, retrying failures with backoff. What is known stays
// in the registry while the API is away.
func (k *kubernetes) Run(ctx context.Context) {
	bo := backoff{min: k.o.MinBackoff, max: k.o.MaxBackoff}
	lastLogged := ""
	for ctx.Err() == nil {
		items, rv, err := k.client.list(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			reason, msg := k.explain(err)
			k.o.Metrics.error(sourceKubernetes, reason)
			k.fail(msg)
			if msg != lastLogged { // one line per distinct problem, not one per retry
				k.o.Log.Error("kubernetes discovery: "+msg, "api", k.client.base, "err", err)
				lastLogged = msg
			}
			if !sleep(ctx, bo.next()) {
				return
			}
			continue
		}
		k.o.Metrics.event(sourceKubernetes, "list")
		k.slices = make(map[string]endpointSlice, len(items))
		for _, s := range items {
			k.slices[s.Metadata.Name] = s
		}
		k.apply()
		if !k.synced {
			k.o.Log.Info("kubernetes discovery synced", "namespace", k.cfg.Namespace, "service", k.cfg.Service,
				"slices", len(items), "workers", len(k.rec.owned))
		}
		k.markSynced()
		lastLogged = ""
		bo.reset()
		if err := k.follow(ctx, &rv); err != nil && ctx.Err() == nil {
			reason, msg := k.explain(err)
			k.o.Metrics.error(sourceKubernetes, reason)
			if errors.Is(err, errGone) {
				k.o.Log.Info("kubernetes discovery: watch expired; listing again", "err", err)
				continue // list again at once
			}
			k.o.Log.Warn("kubernetes discovery: watch ended; listing again: "+msg, "err", err)
			if !sleep(ctx, bo.next()) {
				return
			}
		}
	}
}

// follow watches from *rv, re-watching after each clean end, until a failure that needs a
// re-list.
func (k *kubernetes) follow(ctx context.Context, rv *string) error {
	for ctx.Err() == nil {
		err := k.client.watch(ctx, *rv, func(typ string, obj json.RawMessage) error {
			var s endpointSlice
			if err := json.Unmarshal(obj, &s); err != nil {
				return fmt.Errorf("decode %s event: %w", typ, err)
			}
			switch typ {
			case "BOOKMARK":
				k.o.Metrics.event(sourceKubernetes, "bookmark")
			case "ADDED", "MODIFIED":
				k.o.Metrics.event(sourceKubernetes, strings.ToLower(typ))
				k.slices[s.Metadata.Name] = s
				k.apply()
			case "DELETED":
				k.o.Metrics.event(sourceKubernetes, "deleted")
				delete(k.slices, s.Metadata.Name)
				delete(k.warned, s.Metadata.Name)
				k.apply()
			default:
				return fmt.Errorf("unknown watch event type %q", typ)
			}
			if s.Metadata.ResourceVersion != "" {
				*rv = s.Metadata.ResourceVersion
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// explain classifies err for the errors counter and says what to do about it.
func (k *kubernetes) explain(err error) (reason, msg string) {
	var ae *apiError
	var te *tokenError
	switch {
	case errors.Is(err, errGone):
		return "gone", "resource version too old"
	case errors.Is(err, errSevered):
		return "severed", "the watch stream was cut"
	case errors.As(err, &te):
		return "token", fmt.Sprintf("cannot read the service-account token (discovery.kubernetes.token_file %s)", k.cfg.TokenFile)
	case errors.As(err, &ae) && ae.Code == http.StatusForbidden:
		return "forbidden", fmt.Sprintf("forbidden: kvgate's service account may not list/watch endpointslices in namespace %q; "+
			"grant it a Role with apiGroups [discovery.k8s.io], resources [endpointslices], verbs [list, watch] and a RoleBinding", k.cfg.Namespace)
	case errors.As(err, &ae) && ae.Code == http.StatusUnauthorized:
		return "unauthorized", fmt.Sprintf("unauthorized: the API refused the token in %s", k.cfg.TokenFile)
	case errors.As(err, &ae) && strings.HasPrefix(ae.Message, "watch ERROR"):
		return "watch_error", "the watch reported an error"
	case errors.As(err, &ae):
		return "status", fmt.Sprintf("the API answered %d", ae.Code)
	case strings.HasPrefix(err.Error(), "decode"):
		return "decode", "cannot decode the API's answer"
	}
	return "unreachable", fmt.Sprintf("cannot reach the Kubernetes API at %s", k.client.base)
}

// apply turns the known slices into the desired workers and reconciles the registry.
func (k *kubernetes) apply() {
	k.rec.apply(k.desired())
}

// desired is every endpoint address of every slice with the slice's ports, by worker URL. An
// address listed in several slices (during a rollout) is ready if any lists it ready.
func (k *kubernetes) desired() map[string]Endpoint {
	names := make([]string, 0, len(k.slices))
	for n := range k.slices {
		names = append(names, n)
	}
	sort.Strings(names) // deterministic when slices disagree about an address's ports
	for n := range k.warned {
		if _, ok := k.slices[n]; !ok {
			delete(k.warned, n) // gone since (a re-list dropped it): warn again if it returns
		}
	}
	out := map[string]Endpoint{}
	for _, n := range names {
		s := k.slices[n]
		ports := map[string]int{}
		for _, p := range s.Ports {
			if p.Port != nil {
				name := ""
				if p.Name != nil {
					name = *p.Name
				}
				ports[name] = int(*p.Port)
			}
		}
		httpPort, ok := ports[k.cfg.PortName]
		if !ok {
			k.warnOnce(n, "endpoint slice has no port named "+k.cfg.PortName+"; its endpoints are not workers", "ports", portNames(ports))
			continue
		}
		kv, replay, dp, problem := k.eventPorts(ports)
		if problem != "" {
			k.warnOnce(n, "endpoint slice: "+problem+"; its workers are routed in approximate mode", "ports", portNames(ports))
		}
		for _, m := range s.Endpoints {
			ready := (m.Conditions.Ready == nil || *m.Conditions.Ready) && (m.Conditions.Terminating == nil || !*m.Conditions.Terminating)
			for _, addr := range m.Addresses {
				w := configs.Worker{URL: "http://" + net.JoinHostPort(addr, strconv.Itoa(httpPort)), DPSize: dp}
				if kv > 0 {
					w.KVEvents = "tcp://" + net.JoinHostPort(addr, strconv.Itoa(kv))
					if replay > 0 {
						w.Replay = "tcp://" + net.JoinHostPort(addr, strconv.Itoa(replay))
					}
				}
				if prev, seen := out[w.URL]; seen {
					prev.Ready = prev.Ready || ready
					out[w.URL] = prev
					continue
				}
				out[w.URL] = Endpoint{Worker: w, Ready: ready}
			}
		}
	}
	return out
}

// eventPorts reads the KV-event ports: kv-events (and kv-replay) for one rank, or
// kv-events-<r> (and kv-replay-<r>) for DP ranks 0..n-1, which must be consecutive ports as
// vLLM binds them (rank r on port+r, vllm/distributed/kv_events.py). It returns rank 0's
// ports (0: none, approximate mode), the DP size and why events are not used, if so.
func (k *kubernetes) eventPorts(ports map[string]int) (kv, replay, dp int, problem string) {
	name, rname := k.cfg.KVEventsPortName, k.cfg.ReplayPortName
	if name == "" {
		return 0, 0, 1, ""
	}
	dp = 0
	for ports[name+"-"+strconv.Itoa(dp)] > 0 {
		dp++
	}
	if dp == 0 {
		if ports[name] == 0 {
			return 0, 0, 1, "no port named " + name
		}
		if rname != "" {
			replay = ports[rname]
		}
		return ports[name], replay, 1, ""
	}
	kv = ports[name+"-0"]
	if rname != "" {
		replay = ports[rname+"-0"]
	}
	for r := 1; r < dp; r++ {
		if ports[name+"-"+strconv.Itoa(r)] != kv+r {
			return 0, 0, dp, fmt.Sprintf("port %s-%d is not %s-0 + %d (vLLM publishes rank r on port+r)", name, r, name, r)
		}
		if replay > 0 && ports[rname+"-"+strconv.Itoa(r)] != replay+r {
			replay = 0 // no usable replay: follow the live stream without gap repair
		}
	}
	return kv, replay, dp, ""
}

func (k *kubernetes) warnOnce(slice, msg string, args ...any) {
	if k.warned[slice] {
		return
	}
	k.warned[slice] = true
	k.o.Log.Warn("kubernetes discovery: "+msg, append([]any{"slice", slice}, args...)...)
}

func portNames(ports map[string]int) string {
	names := make([]string, 0, len(ports))
	for n, p := range ports {
		names = append(names, fmt.Sprintf("%s=%d", n, p))
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}
