package deploy

import (
	"bytes"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// serviceMonitor mirrors the fields of the Prometheus Operator's monitoring.coreos.com/v1
// ServiceMonitor that the chart renders (pkg/apis/monitoring/v1/servicemonitor_types.go in
// github.com/prometheus-operator/prometheus-operator: ServiceMonitorSpec, Endpoint,
// SafeAuthorization), with the same JSON names. A local mirror rather than the module: that
// module moves the k8s.io modules' dependencies (cbor, kube-openapi), which rebuilds most of
// the Kubernetes packages for one type. A field the chart renders that the mirror lacks fails
// the strict decode, as one upstream lacks would.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []smEndpoint         `json:"endpoints"`
	} `json:"spec"`
}

type smEndpoint struct {
	Port          string `json:"port"`
	Path          string `json:"path"`
	Interval      string `json:"interval"`
	Authorization *struct {
		Type        string                    `json:"type"`
		Credentials *corev1.SecretKeySelector `json:"credentials"`
	} `json:"authorization"`
}

// newObject returns an empty object of the Go type the Kubernetes API (or the Prometheus
// Operator, for ServiceMonitor: a mirror of its fields) defines for apiVersion and kind; an object the chart has no
// business rendering is an error.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &serviceMonitor{}, nil
	}
	return nil, fmt.Errorf("unexpected object %s %s", apiVersion, kind)
}

// object is one rendered manifest decoded into its API type.
type object struct {
	source string // template path
	kind   string
	name   string
	ns     string // metadata.namespace as rendered ("" = the release's)
	obj    any
}

// String names the object as the object list shows it: Kind/name, with a namespace when the
// manifest sets one.
func (o object) String() string {
	if o.ns != "" {
		return o.kind + "/" + o.name + " (namespace " + o.ns + ")"
	}
	return o.kind + "/" + o.name
}

// decodeManifests splits every rendered template into its YAML documents and decodes each
// strictly (sigs.k8s.io/yaml's UnmarshalStrict: an unknown or duplicate field is an error) into
// its API type.
func decodeManifests(manifests map[string]string) ([]object, error) {
	var out []object
	for _, source := range sortedKeys(manifests) {
		for i, doc := range splitDocuments(manifests[source]) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", source, i, err)
			}
			obj, err := newObject(head.APIVersion, head.Kind)
			if err != nil {
				return nil, fmt.Errorf("%s document %d: %w", source, i, err)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				return nil, fmt.Errorf("%s document %d (%s): %w", source, i, head.Kind, err)
			}
			if head.Metadata.Name == "" {
				return nil, fmt.Errorf("%s document %d (%s): no metadata.name", source, i, head.Kind)
			}
			out = append(out, object{source: source, kind: head.Kind, name: head.Metadata.Name, ns: head.Metadata.Namespace, obj: obj})
		}
	}
	return out, nil
}

// splitDocuments splits a multi-document YAML stream on its "---" separator lines, dropping
// documents that hold only comments or whitespace.
func splitDocuments(text string) []string {
	var docs []string
	var cur bytes.Buffer
	flush := func() {
		doc := cur.String()
		cur.Reset()
		for _, line := range strings.Split(doc, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				docs = append(docs, doc)
				return
			}
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimRight(line, " ") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return docs
}

// only returns the decoded objects of type T.
func only[T any](objs []object) []T {
	var out []T
	for _, o := range objs {
		if t, ok := o.obj.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
