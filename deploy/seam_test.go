package deploy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	chartcommon "helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
)

// TestRenderDecodeStrict is the module's smallest end-to-end check: a one-template chart
// rendered by the Helm engine decodes strictly into its Kubernetes type, and a misspelt field
// is refused rather than dropped.
func TestRenderDecodeStrict(t *testing.T) {
	tests := []struct {
		name    string
		field   string
		wantErr bool
	}{
		{name: "known field", field: "data", wantErr: false},
		{name: "misspelt field", field: "datas", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chrt := &chart.Chart{
				Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "seam", Version: "0.1.0"},
				Templates: []*chartcommon.File{{
					Name: "templates/cm.yaml",
					Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n" +
						tt.field + ":\n  key: {{ .Values.value | quote }}\n"),
				}},
				Values: map[string]any{"value": "default"},
			}
			out, err := renderChart(t.Context(), chrt, map[string]any{"value": "set"}, "rel", "ns")
			if err != nil {
				t.Fatal(err)
			}
			var cm corev1.ConfigMap
			err = yaml.UnmarshalStrict([]byte(out["seam/templates/cm.yaml"]), &cm)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("strict decode accepted unknown field %q", tt.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cm.Name != "rel" || cm.Data["key"] != "set" {
				t.Fatalf("rendered %+v, want name rel and data.key set", cm)
			}
		})
	}
}
