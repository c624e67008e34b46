package deploy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	chartcommon "helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
)

const (
	chartDir      = "helm/kvgate"
	testRelease   = "kvgate"
	testNamespace = "inference"
)

// kvgateConfig is the part of the rendered kvgate configuration the invariants read (the
// whole file goes through kvgate serve --check-config in TestChartConfigAccepted).
type kvgateConfig struct {
	Listen             string `json:"listen"`
	AdminListen        string `json:"admin_listen"`
	ShutdownDrainDelay string `json:"shutdown_drain_delay"`
	ShutdownTimeout    string `json:"shutdown_timeout"`
	Discovery          struct {
		Kubernetes struct {
			Service   string `json:"service"`
			Namespace string `json:"namespace"`
		} `json:"kubernetes"`
	} `json:"discovery"`
	Models []struct {
		Discovery struct {
			Kubernetes struct {
				Service   string `json:"service"`
				Namespace string `json:"namespace"`
			} `json:"kubernetes"`
		} `json:"discovery"`
	} `json:"models"`
	Auth struct {
		APIKeysFile         string `json:"api_keys_file"`
		CacheSaltSecretFile string `json:"cache_salt_secret_file"`
	} `json:"auth"`
	KVEvents struct {
		Listen string `json:"listen"`
	} `json:"kv_events"`
	Cluster struct {
		NATSURL      string `json:"nats_url"`
		FleetKeyFile string `json:"fleet_key_file"`
		NATSCreds    string `json:"nats_creds"`
		EmbeddedNATS struct {
			Listen        string   `json:"listen"`
			ClusterListen string   `json:"cluster_listen"`
			Routes        []string `json:"routes"`
			StoreDir      string   `json:"store_dir"`
		} `json:"embedded_nats"`
	} `json:"cluster"`
}

// files lists the config's file keys that are set.
func (c kvgateConfig) files() []string {
	var out []string
	for _, f := range []string{c.Auth.APIKeysFile, c.Auth.CacheSaltSecretFile, c.Cluster.FleetKeyFile, c.Cluster.NATSCreds} {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// discoveryNamespaces lists the namespaces whose EndpointSlices the config follows, sorted.
func (c kvgateConfig) discoveryNamespaces() []string {
	var ns []string
	add := func(service, namespace string) {
		if service == "" {
			return
		}
		if namespace == "" {
			namespace = testNamespace
		}
		if !slices.Contains(ns, namespace) {
			ns = append(ns, namespace)
		}
	}
	add(c.Discovery.Kubernetes.Service, c.Discovery.Kubernetes.Namespace)
	for _, m := range c.Models {
		add(m.Discovery.Kubernetes.Service, m.Discovery.Kubernetes.Namespace)
	}
	slices.Sort(ns)
	return ns
}

// rendered is one values file rendered and decoded.
type rendered struct {
	values  map[string]any
	objects []object
	config  kvgateConfig
	rawCfg  string // the ConfigMap's kvgate.yaml
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return chrt
}

// renderValues renders the chart with a values file, decodes every object strictly and reads
// the rendered kvgate config out of its ConfigMap.
func renderValues(t *testing.T, chrt *chart.Chart, valuesFile string) rendered {
	t.Helper()
	vals, err := chartcommon.ReadValuesFile(valuesFile)
	if err != nil {
		t.Fatalf("%s: %v", valuesFile, err)
	}
	manifests, err := renderChart(t.Context(), chrt, vals, testRelease, testNamespace)
	if err != nil {
		t.Fatalf("%s: %v", valuesFile, err)
	}
	objs, err := decodeManifests(manifests)
	if err != nil {
		t.Fatalf("%s: %v", valuesFile, err)
	}
	r := rendered{values: vals, objects: objs}
	for _, cm := range only[*corev1.ConfigMap](objs) {
		if text, ok := cm.Data["kvgate.yaml"]; ok {
			if r.rawCfg != "" {
				t.Fatalf("%s: two ConfigMaps hold kvgate.yaml", valuesFile)
			}
			r.rawCfg = text
		}
	}
	if r.rawCfg == "" {
		t.Fatalf("%s: no ConfigMap holds kvgate.yaml", valuesFile)
	}
	if err := yaml.Unmarshal([]byte(r.rawCfg), &r.config); err != nil {
		t.Fatalf("%s: rendered kvgate.yaml: %v", valuesFile, err)
	}
	return r
}

// valuesFiles lists the chart's examples and the test's extra variants (testdata/values).
func valuesFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{chartDir + "/examples/*.yaml", "testdata/values/*.yaml"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 4 {
		t.Fatalf("found %d values files, want the four examples at least: %v", len(files), files)
	}
	return files
}

// podSpec returns the workload's pod template and kind (exactly one workload is rendered).
func podSpec(t *testing.T, objs []object) (corev1.PodTemplateSpec, string, int32, string) {
	t.Helper()
	deps, sets := only[*appsv1.Deployment](objs), only[*appsv1.StatefulSet](objs)
	if len(deps)+len(sets) != 1 {
		t.Fatalf("%d Deployments and %d StatefulSets rendered, want one workload", len(deps), len(sets))
	}
	if len(deps) == 1 {
		return deps[0].Spec.Template, "Deployment", ptrOr(deps[0].Spec.Replicas, 1), ""
	}
	return sets[0].Spec.Template, "StatefulSet", ptrOr(sets[0].Spec.Replicas, 1), sets[0].Spec.ServiceName
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func mustDuration(t *testing.T, key, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("rendered config %s %q: %v", key, s, err)
	}
	return d
}

// TestChartExamples renders every example (and test variant) and checks the invariants the
// chart promises: every object decodes strictly; probes on /live and /ready; a grace period
// above drain + timeout; a non-root, read-only pod with writable HF_HOME and /tmp; every file
// the config names mounted; RBAC exactly list and watch on endpointslices where discovery
// looks; NetworkPolicy ports open only to who needs them; embedded NATS routes through the
// headless Service.
func TestChartExamples(t *testing.T) {
	chrt := loadChart(t)
	for _, file := range valuesFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			r := renderValues(t, chrt, file)
			var list []string
			for _, o := range r.objects {
				list = append(list, o.String())
			}
			t.Logf("%s renders: %s", file, strings.Join(list, ", "))
			checkPod(t, r)
			checkRBAC(t, r)
			checkServices(t, r)
			checkNetworkPolicy(t, r)
			checkServiceMonitor(t, r)
		})
	}
}

func checkPod(t *testing.T, r rendered) {
	tmpl, _, _, _ := podSpec(t, r.objects)
	spec := tmpl.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]

	// Probes: the kubelet sends no key, and /live never fails on the fleet's state.
	for name, p := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{"startup": {c.StartupProbe, "/live"}, "liveness": {c.LivenessProbe, "/live"}, "readiness": {c.ReadinessProbe, "/ready"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe: none or not httpGet", name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe: GET %s on port %s, want %s on http", name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
	}

	// The http port is the one the config listens on, and the image's KVGATE_LISTEN agrees.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if want := fmt.Sprintf("0.0.0.0:%d", ports["http"]); r.config.Listen != want {
		t.Errorf("config listen %q, want %q (container port http)", r.config.Listen, want)
	}
	if v := envValue(c, "KVGATE_LISTEN"); v != r.config.Listen {
		t.Errorf("KVGATE_LISTEN %q differs from the config's listen %q", v, r.config.Listen)
	}
	if _, ok := ports["admin"]; ok != (r.config.AdminListen != "") {
		t.Errorf("admin port declared %v but admin_listen %q", ok, r.config.AdminListen)
	}
	if _, ok := ports["kv-events"]; ok != (r.config.KVEvents.Listen != "") {
		t.Errorf("kv-events port declared %v but kv_events.listen %q", ok, r.config.KVEvents.Listen)
	}

	// Grace period above drain + timeout.
	drain := mustDuration(t, "shutdown_drain_delay", r.config.ShutdownDrainDelay)
	timeout := mustDuration(t, "shutdown_timeout", r.config.ShutdownTimeout)
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= drain+timeout {
		t.Errorf("terminationGracePeriodSeconds %ds, want above shutdown_drain_delay + shutdown_timeout = %v",
			ptrOr(spec.TerminationGracePeriodSeconds, 30), drain+timeout)
	}

	// Security context: non-root, read-only root, no escalation, no capabilities.
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || !ptrOr(psc.RunAsNonRoot, false) || ptrOr(psc.RunAsUser, 0) == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", psc)
	}
	if sc == nil || !ptrOr(sc.ReadOnlyRootFilesystem, false) || ptrOr(sc.AllowPrivilegeEscalation, true) ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, capabilities drop ALL", sc)
	}

	// Writable HF_HOME and /tmp (emptyDir or a claim), the config from the ConfigMap, every
	// file the config names under a read-only Secret mount.
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mountOf := func(path string) (corev1.VolumeMount, bool) {
		var best corev1.VolumeMount
		found := false
		for _, m := range c.VolumeMounts {
			if (path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/")) && len(m.MountPath) > len(best.MountPath) {
				best, found = m, true
			}
		}
		return best, found
	}
	for _, dir := range []string{envValue(c, "HF_HOME"), "/tmp"} {
		m, ok := mountOf(dir)
		if dir == "" || !ok || m.ReadOnly {
			t.Errorf("%q: no writable volume mounted there", dir)
			continue
		}
		if v := volumes[m.Name]; v.EmptyDir == nil && v.PersistentVolumeClaim == nil {
			t.Errorf("%q: volume %s is neither emptyDir nor a claim", dir, m.Name)
		}
	}
	if len(c.Args) != 3 || c.Args[0] != "serve" || c.Args[1] != "--config" {
		t.Fatalf("args %q, want serve --config FILE", c.Args)
	}
	if m, ok := mountOf(c.Args[2]); !ok || volumes[m.Name].ConfigMap == nil || m.SubPath != "kvgate.yaml" {
		t.Errorf("config file %s is not the ConfigMap's kvgate.yaml", c.Args[2])
	}
	for _, f := range r.config.files() {
		m, ok := mountOf(f)
		if !ok || !m.ReadOnly || volumes[m.Name].Secret == nil {
			t.Errorf("config names %s, which is not in a read-only Secret mount", f)
			continue
		}
		if key := filepath.Base(f); !slices.ContainsFunc(volumes[m.Name].Secret.Items, func(it corev1.KeyToPath) bool { return it.Path == key }) {
			t.Errorf("config names %s, but Secret volume %s projects no %s", f, m.Name, key)
		}
	}
	// The API token is mounted only when discovery needs it.
	if want := len(r.config.discoveryNamespaces()) > 0; ptrOr(spec.AutomountServiceAccountToken, true) != want {
		t.Errorf("automountServiceAccountToken %v, want %v (Kubernetes discovery in %v)",
			ptrOr(spec.AutomountServiceAccountToken, true), want, r.config.discoveryNamespaces())
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func checkRBAC(t *testing.T, r rendered) {
	want := r.config.discoveryNamespaces()
	roles, bindings := only[*rbacv1.Role](r.objects), only[*rbacv1.RoleBinding](r.objects)
	var got []string
	for _, role := range roles {
		got = append(got, role.Namespace)
		if len(role.Rules) != 1 {
			t.Errorf("Role %s/%s has %d rules, want exactly one", role.Namespace, role.Name, len(role.Rules))
			continue
		}
		rule := role.Rules[0]
		if !slices.Equal(rule.APIGroups, []string{"discovery.k8s.io"}) || !slices.Equal(rule.Resources, []string{"endpointslices"}) ||
			!slices.Equal(sorted(rule.Verbs), []string{"list", "watch"}) || len(rule.ResourceNames) != 0 || len(rule.NonResourceURLs) != 0 {
			t.Errorf("Role %s/%s rule %+v, want discovery.k8s.io endpointslices list, watch and nothing more", role.Namespace, role.Name, rule)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Roles in namespaces %v, want %v (where the config's discovery looks)", got, want)
	}
	sa := serviceAccountName(t, r)
	if len(bindings) != len(roles) {
		t.Errorf("%d RoleBindings for %d Roles", len(bindings), len(roles))
	}
	for _, b := range bindings {
		if !slices.ContainsFunc(roles, func(role *rbacv1.Role) bool { return role.Name == b.RoleRef.Name && role.Namespace == b.Namespace }) ||
			b.RoleRef.Kind != "Role" {
			t.Errorf("RoleBinding %s/%s binds %s %s, not a rendered Role of its namespace", b.Namespace, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa || b.Subjects[0].Namespace != testNamespace {
			t.Errorf("RoleBinding %s/%s subjects %+v, want only ServiceAccount %s/%s", b.Namespace, b.Name, b.Subjects, testNamespace, sa)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func serviceAccountName(t *testing.T, r rendered) string {
	tmpl, _, _, _ := podSpec(t, r.objects)
	name := tmpl.Spec.ServiceAccountName
	sas := only[*corev1.ServiceAccount](r.objects)
	if len(sas) != 1 || sas[0].Name != name {
		t.Errorf("pod runs as ServiceAccount %q; rendered %d ServiceAccounts", name, len(sas))
	}
	return name
}

func checkServices(t *testing.T, r rendered) {
	tmpl, kind, replicas, serviceName := podSpec(t, r.objects)
	var client, headless *corev1.Service
	for _, s := range only[*corev1.Service](r.objects) {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless = s
		} else {
			client = s
		}
		for k, v := range s.Spec.Selector {
			if tmpl.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which the pods lack", s.Name, k, v)
			}
		}
	}
	if client == nil || !slices.ContainsFunc(client.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "http" && p.TargetPort.String() == "http" }) {
		t.Fatalf("no client Service with port http -> http")
	}
	embedded := r.config.Cluster.EmbeddedNATS.Listen != ""
	if embedded != (kind == "StatefulSet") || embedded != (headless != nil) {
		t.Fatalf("embedded NATS %v, but workload %s and headless Service %v", embedded, kind, headless != nil)
	}
	if !embedded {
		return
	}
	if serviceName != headless.Name || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("StatefulSet serviceName %q, headless Service %q (publishNotReadyAddresses %v)", serviceName, headless.Name, headless.Spec.PublishNotReadyAddresses)
	}
	var want []string
	for i := range int(replicas) {
		want = append(want, fmt.Sprintf("nats-route://%s-%d.%s.%s.svc:%d", testRelease, i, headless.Name, testNamespace, portOf(t, headless, "nats-cluster")))
	}
	if !slices.Equal(r.config.Cluster.EmbeddedNATS.Routes, want) {
		t.Errorf("embedded_nats.routes %v, want every pod's route address %v", r.config.Cluster.EmbeddedNATS.Routes, want)
	}
	if r.config.Cluster.EmbeddedNATS.StoreDir == "" {
		t.Errorf("embedded_nats.store_dir empty (a temporary folder on a read-only root)")
	} else if m := mountPathFor(tmpl.Spec.Containers[0], r.config.Cluster.EmbeddedNATS.StoreDir); m == "" {
		t.Errorf("embedded_nats.store_dir %s is not on a mounted volume", r.config.Cluster.EmbeddedNATS.StoreDir)
	}
}

func mountPathFor(c corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly && (path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/")) {
			return m.MountPath
		}
	}
	return ""
}

func portOf(t *testing.T, s *corev1.Service, name string) int32 {
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return p.Port
		}
	}
	t.Fatalf("Service %s has no port %s", s.Name, name)
	return 0
}

// checkNetworkPolicy: when a policy is rendered, the client port is in a rule, and the admin,
// collector and NATS ports are only in rules that name who may connect (a rule with no from
// admits everyone); NATS only from the release's own pods.
func checkNetworkPolicy(t *testing.T, r rendered) {
	nps := only[*networkingv1.NetworkPolicy](r.objects)
	np0, _ := r.values["networkPolicy"].(map[string]any) // the chart's default: off
	enabled, _ := np0["enabled"].(bool)
	if len(nps) != map[bool]int{true: 1, false: 0}[enabled] {
		t.Fatalf("%d NetworkPolicies rendered, networkPolicy.enabled %v", len(nps), enabled)
	}
	if !enabled {
		return
	}
	np := nps[0]
	tmpl, _, _, _ := podSpec(t, r.objects)
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if tmpl.Labels[k] != v {
			t.Errorf("NetworkPolicy selects %s=%s, which the pods lack", k, v)
		}
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v, want [Ingress]", np.Spec.PolicyTypes)
	}
	open := map[string][]networkingv1.NetworkPolicyPeer{}
	openToAll := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 0 {
			t.Errorf("ingress rule %+v names no port: it opens every port", rule)
		}
		for _, p := range rule.Ports {
			name := p.Port.String()
			open[name] = append(open[name], rule.From...)
			if len(rule.From) == 0 {
				openToAll[name] = true
			}
		}
	}
	if _, ok := open["http"]; !ok {
		t.Errorf("the client port is in no ingress rule")
	}
	for _, port := range []string{"admin", "kv-events", "nats", "nats-cluster"} {
		if openToAll[port] {
			t.Errorf("port %s is open to everyone", port)
		}
	}
	for _, peer := range append(open["nats"], open["nats-cluster"]...) {
		if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil {
			t.Errorf("NATS port open to %+v, want the release's pods only", peer)
			continue
		}
		for k, v := range peer.PodSelector.MatchLabels {
			if tmpl.Labels[k] != v {
				t.Errorf("NATS peer selector %s=%s matches no gateway pod", k, v)
			}
		}
	}
	if embedded := r.config.Cluster.EmbeddedNATS.Listen != ""; embedded != (len(open["nats"]) > 0 && len(open["nats-cluster"]) > 0) {
		t.Errorf("embedded NATS %v, but NATS ports open to %v / %v", embedded, open["nats"], open["nats-cluster"])
	}
	if r.config.KVEvents.Listen != "" && len(open["kv-events"]) == 0 {
		t.Errorf("collector on, but its port is in no ingress rule (the workers cannot publish)")
	}
}

func checkServiceMonitor(t *testing.T, r rendered) {
	for _, sm := range only[*serviceMonitor](r.objects) {
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor endpoints %+v, want one on /metrics", sm.Spec.Endpoints)
			continue
		}
		port := sm.Spec.Endpoints[0].Port
		found := false
		for _, s := range only[*corev1.Service](r.objects) {
			if s.Spec.ClusterIP != corev1.ClusterIPNone && slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
				found = true
			}
		}
		if !found {
			t.Errorf("ServiceMonitor scrapes port %q, which the client Service lacks", port)
		}
	}
}

// TestChartRefusesBadValues: values that would deploy a broken or unsafe gateway fail the
// render (or the schema) with a message naming what to change.
func TestChartRefusesBadValues(t *testing.T) {
	chrt := loadChart(t)
	base := func() map[string]any {
		return map[string]any{"config": map[string]any{"model": "m", "discovery": map[string]any{"kubernetes": map[string]any{"service": "vllm"}}}}
	}
	tests := []struct {
		name string
		edit func(v map[string]any)
		want string
	}{
		{"chart-owned listen", func(v map[string]any) { v["config"].(map[string]any)["listen"] = "127.0.0.1:9000" }, "config.listen is set by the chart"},
		{"chart-owned drain", func(v map[string]any) { v["config"].(map[string]any)["shutdown_timeout"] = "1m" }, "config.shutdown_timeout is set by the chart"},
		{"chart-owned secret file", func(v map[string]any) {
			v["config"].(map[string]any)["auth"] = map[string]any{"api_keys_file": "/keys"}
		}, "use secrets.clientKeys"},
		{"grace period too short", func(v map[string]any) { v["terminationGracePeriodSeconds"] = 35 }, "must exceed"},
		{"unknown nats mode", func(v map[string]any) { v["nats"] = map[string]any{"mode": "mesh"} }, "/nats/mode"},
		{"external nats without url", func(v map[string]any) { v["nats"] = map[string]any{"mode": "external"} }, "needs config.cluster.nats_url"},
		{"collector closed by policy", func(v map[string]any) {
			v["collector"] = map[string]any{"enabled": true}
			v["networkPolicy"] = map[string]any{"enabled": true}
		}, "collectorFrom"},
		{"unknown value", func(v map[string]any) { v["replicas"] = 3 }, "replicas"},
		{"mistyped value", func(v map[string]any) { v["replicaCount"] = "3" }, "replicaCount"},
		{"admin scrape without admin", func(v map[string]any) {
			v["serviceMonitor"] = map[string]any{"enabled": true, "port": "admin"}
		}, "needs admin.enabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := base()
			tt.edit(v)
			_, err := renderChart(t.Context(), chrt, v, testRelease, testNamespace)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("render error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestChartDashboardIsTheOriginal: Helm reads no file outside the chart, so the chart ships a
// copy of deploy/grafana/kvgate.json; it must be that file, byte for byte.
func TestChartDashboardIsTheOriginal(t *testing.T) {
	orig, err := os.ReadFile("grafana/kvgate.json")
	if errors.Is(err, fs.ErrNotExist) {
		// The dashboard's own commit (its PromQL test beside it) lands separately and copies it.
		t.Skip("deploy/grafana/kvgate.json is not in this tree yet")
	}
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile(chartDir + "/dashboards/kvgate.json")
	if err != nil {
		t.Fatal(err)
	}
	if string(orig) != string(cp) {
		t.Fatalf("%s/dashboards/kvgate.json differs from grafana/kvgate.json: cp deploy/grafana/kvgate.json deploy/%s/dashboards/", chartDir, chartDir)
	}
}
