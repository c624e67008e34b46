{{/* Names and labels. */}}
{{- define "kvgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The headless Service the embedded NATS servers route through. */}}
{{- define "kvgate.natsServiceName" -}}
{{- printf "%s-nats" (include "kvgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvgate.embeddedNATS" -}}
{{- if eq .Values.nats.mode "embedded" }}true{{ end -}}
{{- end -}}

{{/* Where the config and the file secrets are mounted. */}}
{{- define "kvgate.configPath" -}}/etc/kvgate/kvgate.yaml{{- end -}}
{{- define "kvgate.secretsDir" -}}/etc/kvgate/secrets{{- end -}}
{{- define "kvgate.hfHome" -}}/var/cache/kvgate/hf{{- end -}}
{{- define "kvgate.natsStoreDir" -}}/var/lib/kvgate/nats{{- end -}}

{{/*
File secrets: values key, config section, config key, mount folder. The config key is set to
<secretsDir>/<folder>/<key of the Secret>.
*/}}
{{- define "kvgate.fileSecrets" -}}
clientKeys: {section: auth, key: api_keys_file, dir: client-keys}
cacheSaltSecret: {section: auth, key: cache_salt_secret_file, dir: cache-salt}
fleetKey: {section: cluster, key: fleet_key_file, dir: fleet-key}
natsCreds: {section: cluster, key: nats_creds, dir: nats-creds}
{{- end -}}

{{/* Environment secrets: values key -> variable. */}}
{{- define "kvgate.envSecrets" -}}
workerApiKey: KVGATE_AUTH_WORKER_API_KEY
adminToken: KVGATE_ADMIN_TOKEN
natsPassword: KVGATE_CLUSTER_NATS_PASSWORD
embeddedNatsToken: KVGATE_CLUSTER_EMBEDDED_NATS_TOKEN
hfToken: HF_TOKEN
{{- end -}}

{{/*
kvgate.config renders the kvgate YAML: values.config with the keys the chart owns set from
the other values. A key the chart owns that config sets as well fails the render, naming the
value to use instead.
*/}}
{{- define "kvgate.config" -}}
{{- $cfg := deepCopy (default dict .Values.config) -}}
{{- $owned := dict "listen" "ports.http" "admin_listen" "admin.enabled and ports.admin" "shutdown_drain_delay" "shutdown.drainDelaySeconds" "shutdown_timeout" "shutdown.timeoutSeconds" -}}
{{- range $k, $v := $owned -}}
{{- if hasKey $cfg $k -}}
{{- fail (printf "config.%s is set by the chart: use %s" $k $v) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.ports.http)) -}}
{{- if .Values.admin.enabled -}}
{{- $_ := set $cfg "admin_listen" (printf "0.0.0.0:%d" (int .Values.ports.admin)) -}}
{{- end -}}
{{- $_ := set $cfg "shutdown_drain_delay" (printf "%ds" (int .Values.shutdown.drainDelaySeconds)) -}}
{{- $_ := set $cfg "shutdown_timeout" (printf "%ds" (int .Values.shutdown.timeoutSeconds)) -}}
{{- /* kv_events.listen */ -}}
{{- $kve := deepCopy (default dict (get $cfg "kv_events")) -}}
{{- if hasKey $kve "listen" -}}
{{- fail "config.kv_events.listen is set by the chart: use collector.enabled and ports.kvEvents" -}}
{{- end -}}
{{- if .Values.collector.enabled -}}
{{- $_ := set $kve "listen" (printf "tcp://0.0.0.0:%d" (int .Values.ports.kvEvents)) -}}
{{- $_ := set $cfg "kv_events" $kve -}}
{{- end -}}
{{- /* cluster */ -}}
{{- $cl := deepCopy (default dict (get $cfg "cluster")) -}}
{{- if hasKey $cl "replica_id" -}}
{{- fail "config.cluster.replica_id is set by the chart: each pod's name" -}}
{{- end -}}
{{- $en := deepCopy (default dict (get $cl "embedded_nats")) -}}
{{- range $k := list "listen" "cluster_listen" "routes" "store_dir" -}}
{{- if hasKey $en $k -}}
{{- fail (printf "config.cluster.embedded_nats.%s is set by the chart: use nats.mode embedded" $k) -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.nats.mode "embedded" -}}
{{- if (get $cl "nats_url") -}}
{{- fail "config.cluster.nats_url names a NATS server but nats.mode is embedded: use nats.mode external" -}}
{{- end -}}
{{- $routes := list -}}
{{- $svc := include "kvgate.natsServiceName" . -}}
{{- $full := include "kvgate.fullname" . -}}
{{- range $i := until (int .Values.replicaCount) -}}
{{- $routes = append $routes (printf "nats-route://%s-%d.%s.%s.svc:%d" $full $i $svc $.Release.Namespace (int $.Values.ports.natsCluster)) -}}
{{- end -}}
{{- $_ := set $en "listen" (printf "0.0.0.0:%d" (int .Values.ports.nats)) -}}
{{- $_ := set $en "cluster_listen" (printf "0.0.0.0:%d" (int .Values.ports.natsCluster)) -}}
{{- $_ := set $en "routes" $routes -}}
{{- $_ := set $en "store_dir" (include "kvgate.natsStoreDir" .) -}}
{{- $_ := set $en "max_memory" .Values.nats.maxMemory -}}
{{- $_ := set $cl "embedded_nats" $en -}}
{{- else if eq .Values.nats.mode "external" -}}
{{- if not (get $cl "nats_url") -}}
{{- fail "nats.mode external needs config.cluster.nats_url (nats://host:port of your NATS)" -}}
{{- end -}}
{{- end -}}
{{- /* file secrets */ -}}
{{- $au := deepCopy (default dict (get $cfg "auth")) -}}
{{- $sections := dict "auth" $au "cluster" $cl -}}
{{- range $name, $f := (include "kvgate.fileSecrets" . | fromYaml) -}}
{{- $ref := get $.Values.secrets $name -}}
{{- $sec := get $sections $f.section -}}
{{- if hasKey $sec $f.key -}}
{{- fail (printf "config.%s.%s is set by the chart: use secrets.%s" $f.section $f.key $name) -}}
{{- end -}}
{{- if $ref.name -}}
{{- $_ := set $sec $f.key (printf "%s/%s/%s" (include "kvgate.secretsDir" $) $f.dir $ref.key) -}}
{{- end -}}
{{- end -}}
{{- if $au -}}{{- $_ := set $cfg "auth" $au -}}{{- end -}}
{{- if $cl -}}{{- $_ := set $cfg "cluster" $cl -}}{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
kvgate.discoveryNamespaces lists (as YAML) the namespaces whose EndpointSlices the config's
Kubernetes discovery follows: the top-level discovery and each models[] entry's, the release's
namespace where one leaves namespace empty (kvgate uses the pod's own).
*/}}
{{- define "kvgate.discoveryNamespaces" -}}
{{- $cfg := default dict .Values.config -}}
{{- $sources := list (default dict (get $cfg "discovery")) -}}
{{- range $m := (default list (get $cfg "models")) -}}
{{- $sources = append $sources (default dict (get $m "discovery")) -}}
{{- end -}}
{{- $ns := list -}}
{{- range $d := $sources -}}
{{- $k := default dict (get $d "kubernetes") -}}
{{- if get $k "service" -}}
{{- $ns = append $ns (default $.Release.Namespace (get $k "namespace")) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "namespaces" ($ns | uniq | sortAlpha)) -}}
{{- end -}}

{{/* The termination grace period: above drain delay + timeout. */}}
{{- define "kvgate.terminationGrace" -}}
{{- $sum := add (int .Values.shutdown.drainDelaySeconds) (int .Values.shutdown.timeoutSeconds) -}}
{{- $set := int .Values.terminationGracePeriodSeconds -}}
{{- if eq $set 0 -}}
{{- add $sum 10 -}}
{{- else if le $set $sum -}}
{{- fail (printf "terminationGracePeriodSeconds %d must exceed shutdown.drainDelaySeconds + shutdown.timeoutSeconds (%d), or Kubernetes kills the streams the gateway is still finishing" $set $sum) -}}
{{- else -}}
{{- $set -}}
{{- end -}}
{{- end -}}
