package deploy

import (
	"context"
	"fmt"
	"sort"
	"strings"

	chartcommon "helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/engine"
)

// renderChart renders chrt offline (no cluster: the engine gets no client, so a template's
// lookup returns nothing) with the given values over the chart's own, as `helm template`
// would, and returns the rendered manifests by template path, templates that rendered to
// nothing and NOTES.txt left out. The values are validated against values.schema.json.
func renderChart(ctx context.Context, chrt *chart.Chart, values map[string]any, release, namespace string) (map[string]string, error) {
	opts := chartcommon.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(chrt, values, opts, chartcommon.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	eng := engine.Engine{Strict: true}
	out, err := eng.RenderWithContext(ctx, chrt, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	manifests := make(map[string]string, len(out))
	for name, text := range out {
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(text) == "" {
			continue
		}
		manifests[name] = text
	}
	return manifests, nil
}

// sortedKeys returns m's keys in order, so a test's failures and listings are stable.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
