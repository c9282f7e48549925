{{- define "smlens.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "smlens.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "smlens.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "smlens.selectorLabels" -}}
app.kubernetes.io/name: {{ include "smlens.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "smlens.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "smlens.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: exporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "smlens.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "smlens.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "smlens.image" -}}
{{- $repository := .Values.image.repository }}
{{- if .Values.image.registry }}
{{- $repository = printf "%s/%s" .Values.image.registry .Values.image.repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- $tag := .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-dcgm" "" .Values.dcgm.enabled)) }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/*
The thresholds the rules and dashboards use, as YAML (callers read it back with fromYaml): the copy of
smlens' thresholds.yaml under files/, then the job name that this chart's monitor gives the exporters
(so the exporter-down alert finds them whatever the release is called), then .Values.thresholds.
*/}}
{{- define "smlens.verdicts.thresholds" -}}
{{- $shipped := .Files.Get "files/thresholds.yaml" | fromYaml }}
{{- $job := include "smlens.fullname" . }}
{{- if and .Values.podMonitor.enabled (not .Values.serviceMonitor.enabled) }}
{{- $job = printf "%s/%s" (include "smlens.namespace" .) (include "smlens.fullname" .) }}
{{- end }}
{{- $thresholds := set (deepCopy $shipped) "exporter_job" $job }}
{{- /* set, not merge: merge would take an override of 0 for "no value" */}}
{{- range $name, $value := .Values.thresholds }}
{{- $_ := set $thresholds $name $value }}
{{- end }}
{{- toYaml $thresholds }}
{{- end }}

{{/*
A file from files/rules or files/dashboards with its threshold placeholders (see tools/helm_sync.py)
replaced by the values in .thresholds: differences of two ratios first, then each threshold as a whole
percentage and as itself. Called with (dict "text" ... "thresholds" ...).
*/}}
{{/*
A number as Python's repr writes a float: 3.0, 0.25 (the generated rules' form).
*/}}
{{- define "smlens.float" -}}
{{- $value := float64 . }}
{{- if eq $value (floor $value) }}{{ printf "%.1f" $value }}{{ else }}{{ toString $value }}{{ end }}
{{- end }}

{{/*
The price table's static series, as smlens.bundle.accounting.price_rules writes them: a YAML list.
*/}}
{{- define "smlens.priceRules" -}}
{{- $currency := .currency | default "USD" }}
{{- $rules := list }}
{{- range $model, $price := .gpu_hour }}
{{- $labels := dict "model" $model "currency" $currency }}
{{- $rules = append $rules (dict "record" "model:gpu_price_per_hour:configured" "expr" (printf "vector(%s)" (include "smlens.float" $price)) "labels" $labels) }}
{{- end }}
{{- range $key, $price := .mig_instance_hour }}
{{- $labels := dict "model" (first (splitList "/" $key)) "mig_profile" (last (splitList "/" $key)) "currency" $currency }}
{{- $rules = append $rules (dict "record" "model:gpu_price_per_hour:configured" "expr" (printf "vector(%s)" (include "smlens.float" $price)) "labels" $labels) }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{- define "smlens.withThresholds" -}}
{{- $text := .text }}
{{- $thresholds := .thresholds }}
{{- range $placeholder := regexFindAll "__SMLENS_THRESHOLD_[a-z0-9_]+_MINUS_[a-z0-9_]+_PERCENT__" $text -1 | uniq }}
{{- $names := regexReplaceAll "^__SMLENS_THRESHOLD_|_PERCENT__$" $placeholder "" | splitList "_MINUS_" }}
{{- $difference := subf (float64 (get $thresholds (first $names))) (float64 (get $thresholds (last $names))) }}
{{- $text = replace $placeholder (printf "%.0f%%" (mulf $difference 100)) $text }}
{{- end }}
{{- range $name, $value := .thresholds }}
{{- $percent := printf "__SMLENS_THRESHOLD_%s_PERCENT__" $name }}
{{- if contains $percent $text }}
{{- $text = replace $percent (printf "%.0f%%" (mulf (float64 $value) 100)) $text }}
{{- end }}
{{- $written := toString $value }}
{{- if and (or (kindIs "float64" $value) (kindIs "int64" $value)) (eq (float64 $value) (floor $value)) }}
{{- /* whole numbers as Python writes floats: 1.0, not 1 */}}
{{- $written = printf "%.1f" (float64 $value) }}
{{- end }}
{{- $text = replace (printf "__SMLENS_THRESHOLD_%s__" $name) $written $text }}
{{- end }}
{{- $text }}
{{- end }}

{{/*
Relabelings shared by the ServiceMonitor and the PodMonitor. Prometheus Operator labels every target
with the exporter pod's own namespace, pod and container; smlens puts the namespace, pod and container
of the GPU's workload on its series. The target's labels are moved to exporter_* names so they can
neither land on GPU series nor clash with the workload's, and the node name is added.
*/}}
{{- define "smlens.relabelings" -}}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- range list "namespace" "pod" "container" }}
- action: replace
  sourceLabels: [{{ . }}]
  targetLabel: exporter_{{ . }}
{{- end }}
- action: labeldrop
  regex: namespace|pod|container
{{- with .relabelings }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "smlens.checks" -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: enable one, or Prometheus scrapes every exporter twice and every sum doubles." }}
{{- end }}
{{- $user := .Values.securityContext.runAsUser }}
{{- if and .Values.podResources.enabled (hasKey .Values.securityContext "runAsUser") (ne (toString $user) "0") }}
{{- fail "podResources.enabled needs the container to run as uid 0 because the kubelet's socket is owned by root: remove securityContext.runAsUser (the chart then picks uid 0), or set podResources.enabled=false for the strict non-root mode." }}
{{- end }}
{{- if and .Values.dcgm.embedded (hasKey .Values.securityContext "runAsUser") (ne (toString $user) "0") }}
{{- fail "dcgm.embedded needs the container to run as uid 0 for DCGM profiling: remove securityContext.runAsUser (the chart then picks uid 0)." }}
{{- end }}
{{- $web := .Values.webConfig }}
{{- if and $web.enabled (not $web.existingSecret) (not $web.config) (not $web.tlsSecret) }}
{{- fail "webConfig.enabled needs webConfig.config, webConfig.tlsSecret or webConfig.existingSecret: there is no web config file to serve with." }}
{{- end }}
{{- if and $web.enabled $web.existingSecret (not $web.scrape.scheme) }}
{{- fail "webConfig.existingSecret: set webConfig.scrape.scheme to https or http, as the chart cannot read the Secret to know whether it turns TLS on." }}
{{- end }}
{{- if and $web.enabled $web.existingSecret $web.config }}
{{- fail "webConfig.existingSecret and webConfig.config are both set: the file comes from one of them." }}
{{- end }}
{{- if and $web.enabled $web.protectProbes (not (and (dig "httpGet" "httpHeaders" "" .Values.livenessProbe) (dig "httpGet" "httpHeaders" "" .Values.readinessProbe))) }}
{{- fail "webConfig.protectProbes puts the probes behind basic auth: give livenessProbe.httpGet.httpHeaders and readinessProbe.httpGet.httpHeaders an Authorization header too." }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled: a ServiceMonitor finds the exporters through their Service (or use podMonitor instead)." }}
{{- end }}
{{- end }}

{{/*
Web config: the file's content when the chart makes the Secret (tlsSecret's files filled in as
tls_server_config.cert_file/key_file unless given), and the scheme the monitors and probes use.
*/}}
{{- define "smlens.webConfigFile" -}}
{{- $config := deepCopy .Values.webConfig.config }}
{{- if .Values.webConfig.tlsSecret }}
{{- $tls := get $config "tls_server_config" | default dict }}
{{- if not (or (hasKey $tls "cert_file") (hasKey $tls "cert")) }}
{{- $_ := set $tls "cert_file" "/etc/smlens-tls/tls.crt" }}
{{- end }}
{{- if not (or (hasKey $tls "key_file") (hasKey $tls "key")) }}
{{- $_ := set $tls "key_file" "/etc/smlens-tls/tls.key" }}
{{- end }}
{{- $_ := set $config "tls_server_config" $tls }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{- define "smlens.webScheme" -}}
{{- $web := .Values.webConfig }}
{{- if not $web.enabled }}http
{{- else if $web.scrape.scheme }}{{ $web.scrape.scheme }}
{{- else if or $web.tlsSecret (hasKey $web.config "tls_server_config") }}https
{{- else }}http
{{- end }}
{{- end }}

{{/*
The scrape endpoint's TLS and basic auth settings, shared by the ServiceMonitor and the PodMonitor.
*/}}
{{- define "smlens.scrapeAuth" -}}
{{- $web := .Values.webConfig }}
{{- if eq (include "smlens.webScheme" .) "https" }}
{{- $tlsConfig := $web.scrape.tlsConfig }}
{{- if and (not $tlsConfig) $web.tlsSecret }}
{{- $tlsConfig = dict "ca" (dict "secret" (dict "name" $web.tlsSecret "key" "ca.crt")) "serverName" (printf "%s.%s.svc" (include "smlens.fullname" .) (include "smlens.namespace" .)) }}
{{- end }}
{{- with $tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- with $web.scrape.basicAuthSecret }}
{{- if $web.enabled }}
basicAuth:
  username:
    name: {{ . }}
    key: username
  password:
    name: {{ . }}
    key: password
{{- end }}
{{- end }}
{{- end }}

{{/*
A probe from values, switched to HTTPS when the exporter serves TLS only.
*/}}
{{- define "smlens.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if and (eq .scheme "https") $probe.httpGet }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/*
The container's securityContext: .Values.securityContext, with the user the features need unless the
values set one (uid 0 for the kubelet socket or embedded DCGM, else 65532 and runAsNonRoot).
*/}}
{{- define "smlens.securityContext" -}}
{{- $context := deepCopy .Values.securityContext }}
{{- $root := or .Values.podResources.enabled .Values.dcgm.embedded }}
{{- if not (hasKey $context "runAsUser") }}
{{- $_ := set $context "runAsUser" (ternary 0 65532 $root) }}
{{- end }}
{{- if not (hasKey $context "runAsGroup") }}
{{- $_ := set $context "runAsGroup" (ternary 0 65532 $root) }}
{{- end }}
{{- if not (hasKey $context "runAsNonRoot") }}
{{- $_ := set $context "runAsNonRoot" (ne (toString $context.runAsUser) "0") }}
{{- end }}
{{- if .Values.profile.enabled }}
{{- $capabilities := deepCopy (default dict $context.capabilities) }}
{{- $_ := set $capabilities "add" (append (default list $capabilities.add) "SYS_ADMIN" | uniq) }}
{{- $_ := set $context "capabilities" $capabilities }}
{{- end }}
{{- if .Values.privileged }}
{{- $_ := set $context "privileged" true }}
{{- $_ := unset $context "allowPrivilegeEscalation" }}
{{- $_ := unset $context "capabilities" }}
{{- end }}
{{- toYaml $context }}
{{- end }}

{{/*
"true" where ServiceMonitor, PodMonitor and PrometheusRule render (see monitoringCRDs in values.yaml).
*/}}
{{- define "smlens.monitoringCRDs" -}}
{{- if or (eq .Values.monitoringCRDs "always") (and (eq .Values.monitoringCRDs "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) }}true{{- end }}
{{- end }}

{{/*
Labels of a ServiceMonitor, PodMonitor or PrometheusRule, as YAML: release=prometheusRelease (the label
kube-prometheus-stack's Prometheus selects them by) under the object's additionalLabels, which win.
Called with (dict "root" $ "additionalLabels" .Values.<object>.additionalLabels).
*/}}
{{- define "smlens.operatorLabels" -}}
{{- $labels := deepCopy (.additionalLabels | default dict) }}
{{- with .root.Values.prometheusRelease }}
{{- $labels = merge $labels (dict "release" .) }}
{{- end }}
{{- with $labels }}{{ toYaml . }}{{ end }}
{{- end }}
