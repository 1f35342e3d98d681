{{/* Chart name, cut to the 63 characters a label value allows. */}}
{{- define "muster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, plus the chart name unless the release name contains it. */}}
{{- define "muster.fullname" -}}
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

{{- define "muster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "muster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "muster.ownLabels" -}}
helm.sh/chart: {{ include "muster.chartLabel" . }}
{{ include "muster.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller-manager
{{- end }}

{{/*
Label maps merged into one (YAML, keys sorted): a key of an earlier map wins over the same key of
a later one, so the chart's own labels (selectors depend on them) always win over commonLabels.
*/}}
{{- define "muster.mergeLabels" -}}
{{- $out := dict }}
{{- range . }}
{{- $out = merge $out (default (dict) .) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Labels of the controller manager's objects: the chart's, then commonLabels. */}}
{{- define "muster.labels" -}}
{{- include "muster.mergeLabels" (list (include "muster.ownLabels" . | fromYaml) .Values.commonLabels) }}
{{- end }}

{{/* Like muster.labels, with `extra` (a map) between the chart's labels and commonLabels. */}}
{{- define "muster.labelsWith" -}}
{{- $root := index . 0 }}
{{- include "muster.mergeLabels" (list (include "muster.ownLabels" $root | fromYaml) (index . 1) $root.Values.commonLabels) }}
{{- end }}

{{- define "muster.chartLabel" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The node agent's objects and pods. Its pods carry their own `app.kubernetes.io/name`, so that
nothing selecting the controller manager's pods (the Deployment, its PodDisruptionBudget,
Services, NetworkPolicy and anti-affinity all select `muster.selectorLabels`) ever selects them.
*/}}
{{- define "muster.nodeAgentName" -}}
{{- printf "%s-node-agent" (include "muster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "muster.nodeAgentSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-node-agent" (include "muster.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "muster.nodeAgentOwnLabels" -}}
helm.sh/chart: {{ include "muster.chartLabel" . }}
{{ include "muster.nodeAgentSelectorLabels" . }}
app.kubernetes.io/part-of: {{ include "muster.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "muster.nodeAgentLabels" -}}
{{- include "muster.mergeLabels" (list (include "muster.nodeAgentOwnLabels" . | fromYaml) .Values.commonLabels) }}
{{- end }}

{{/* The node agent's ServiceAccount as the apiserver names it (the admission policy matches it). */}}
{{- define "muster.nodeAgentUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "muster.nodeAgentName" .) }}
{{- end }}

{{- /* muster's own user name: its writes skip its webhooks (src/webhook/config.rs, own_requests_skipped). */}}
{{- define "muster.controllerUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "muster.serviceAccountName" .) }}
{{- end }}

{{- define "muster.matchConditions" -}}
matchConditions:
  - name: not-muster-itself
    expression: {{ printf "request.userInfo.username != '%s'" (include "muster.controllerUser" .) | quote }}
{{- end }}

{{- define "muster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "muster.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* `repository@digest` when a digest is set, else `repository:tag`. */}}
{{- define "muster.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The webhook Service (its DNS names are in the serving certificate). */}}
{{- define "muster.webhookService" -}}
{{- printf "%s-webhook" (include "muster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "muster.metricsService" -}}
{{- printf "%s-metrics" (include "muster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Secret with the webhook serving certificate (self-managed or cert-manager's). */}}
{{- define "muster.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "muster.fullname" .)) .Values.webhook.certificate.secretName }}
{{- end }}

{{- define "muster.certManager" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificate.mode "cert-manager") }}true{{ end }}
{{- end }}

{{- define "muster.selfManagedCert" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificate.mode "self-managed") }}true{{ end }}
{{- end }}

{{/*
Names muster uses and does not take from flags: the Lease of the leader (src/controllers/mod.rs
LEASE_NAME), the webhook configurations (src/webhook/config.rs) and the CRDs (crds/). The chart
tests check them against the code and crds/.
*/}}
{{- define "muster.leaseName" -}}muster-controller-manager{{- end }}
{{- define "muster.validatingName" -}}muster-validating{{- end }}
{{- define "muster.mutatingName" -}}muster-mutating{{- end }}
{{- define "muster.recordApiPolicyName" -}}muster-scheduling-api{{- end }}
{{- /* Non-empty where the API server serves MutatingAdmissionPolicies: the scheduling API of a
new job is then recorded by one (webhook-configurations.yaml), not by muster's webhook. */}}
{{- define "muster.recordApiPolicy" -}}
{{- if and (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicyBinding") }}true{{- end }}
{{- end }}
{{- define "muster.crdNames" -}}
- musterjobs.batch.muster.dev
- musterjobsets.batch.muster.dev
- workloads.scheduling.muster.dev
- podgroups.scheduling.muster.dev
- compositepodgroups.scheduling.muster.dev
- nodegpureports.gpu.muster.dev
{{- end }}

{{/* cert-manager's Certificate, as `<namespace>/<name>` for cert-manager.io/inject-ca-from. */}}
{{- define "muster.certificateName" -}}
{{- printf "%s-webhook" (include "muster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The clientConfig of a webhook: the development URL or the Service. */}}
{{- define "muster.clientConfig" -}}
{{- $root := index . 0 }}
{{- $path := index . 1 }}
{{- if $root.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhook.url) $path | quote }}
{{- else }}
service:
  namespace: {{ $root.Release.Namespace }}
  name: {{ include "muster.webhookService" $root }}
  path: {{ $path }}
  port: {{ int64 $root.Values.webhook.service.port }}
{{- end }}
{{- end }}

{{/*
muster's own namespace and kube-system never reach the webhooks (src/webhook/config.rs).
webhook.namespaceSelector adds to that (ANDed), so it can only narrow it.
*/}}
{{- define "muster.namespaceSelector" -}}
namespaceSelector:
  {{- with .Values.webhook.namespaceSelector.matchLabels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        - {{ .Release.Namespace }}
        - kube-system
    {{- with .Values.webhook.namespaceSelector.matchExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
Only pods that join a PodGroup are gated (src/webhook/config.rs); webhook.objectSelector adds to
that (ANDed), so it can only narrow it.
*/}}
{{- define "muster.objectSelector" -}}
objectSelector:
  {{- with .Values.webhook.objectSelector.matchLabels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  matchExpressions:
    - key: scheduling.muster.dev/pod-group
      operator: Exists
    {{- with .Values.webhook.objectSelector.matchExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* The secure metrics certificate's mount (metrics.secure.certSecret). */}}
{{- define "muster.metricsCertDir" -}}/etc/muster/metrics-certs{{- end }}

{{/*
`muster run`'s arguments, one quoted YAML list item each (the Deployment drops those that
extraArgs replaces).
*/}}
{{- define "muster.runArgs" -}}
- {{ printf "--log-level=%s" .Values.logLevel | quote }}
- {{ printf "--log-format=%s" .Values.logFormat | quote }}
- {{ printf "--metrics-bind-address=0.0.0.0:%d" (int64 .Values.metrics.port) | quote }}
{{- if .Values.metrics.secure.enabled }}
- {{ printf "--metrics-secure-bind-address=0.0.0.0:%d" (int64 .Values.metrics.secure.port) | quote }}
{{- if .Values.metrics.secure.certSecret }}
- {{ printf "--metrics-cert-dir=%s" (include "muster.metricsCertDir" .) | quote }}
{{- end }}
{{- end }}
- {{ printf "--leader-elect=%t" .Values.leaderElection.enabled | quote }}
- {{ printf "--leader-elect-lease-duration=%d" (int64 .Values.leaderElection.leaseDurationSeconds) | quote }}
- {{ printf "--leader-elect-renew-grace=%d" (int64 .Values.leaderElection.renewGraceSeconds) | quote }}
- {{ printf "--install-crds=%t" .Values.crds.install | quote }}
- {{ printf "--bind-timeout=%d" (int64 .Values.controller.bindTimeoutSeconds) | quote }}
- {{ printf "--placement-strategy=%s" .Values.controller.placementStrategy | quote }}
- {{ printf "--scheduling-api=%s" .Values.controller.schedulingApi | quote }}
{{- if .Values.controller.requireSingleNuma }}
- "--require-single-numa"
{{- end }}
- {{ printf "--gpu-max-temperature=%v" .Values.controller.gpu.maxTemperature | quote }}
- {{ printf "--gpu-min-free-memory=%v" .Values.controller.gpu.minFreeMemory | quote }}
- {{ printf "--gpu-metrics-ttl=%d" (int64 .Values.controller.gpu.metricsTTLSeconds) | quote }}
- {{ printf "--dra-gpu-device-class=%s" .Values.controller.gpu.draDeviceClass | quote }}
- {{ printf "--kube-api-in-flight=%d" (int64 .Values.controller.kubeApiInFlight) | quote }}
{{- with .Values.controller.prometheusUrl }}
- {{ printf "--prometheus-url=%s" . | quote }}
{{- end }}
{{- if .Values.webhook.enabled }}
- {{ printf "--webhook-bind-address=0.0.0.0:%d" (int64 .Values.webhook.port) | quote }}
{{- with .Values.webhook.url }}
- {{ printf "--webhook-url=%s" . | quote }}
{{- end }}
- {{ printf "--webhook-service=%s" (include "muster.webhookService" .) | quote }}
- {{ printf "--webhook-service-port=%d" (int64 .Values.webhook.service.port) | quote }}
{{- /* The chart owns the webhook configurations; muster only injects their caBundle. */}}
- "--webhook-manage-configurations=false"
- {{ printf "--webhook-resync=%d" (int64 .Values.webhook.certificate.resyncSeconds) | quote }}
{{- if include "muster.certManager" . }}
- "--webhook-cert-dir=/etc/muster/webhook-certs"
{{- else }}
- {{ printf "--webhook-secret=%s" (include "muster.webhookSecret" .) | quote }}
- {{ printf "--webhook-cert-validity=%d" (int64 .Values.webhook.certificate.validitySeconds) | quote }}
- {{ printf "--webhook-cert-rotate-before=%d" (int64 .Values.webhook.certificate.rotateBeforeSeconds) | quote }}
{{- end }}
{{- else }}
- "--webhook-bind-address=off"
{{- end }}
{{- end }}

{{/* A flag's name: `--name` of `--name=value`. */}}
{{- define "muster.flagName" -}}
{{- regexReplaceAll "=.*$" (toString .) "" }}
{{- end }}

{{/* An alert's labels: its severity, then prometheusRule.alertLabels. */}}
{{- define "muster.alertLabels" -}}
{{- $r := index . 0 }}
{{- toYaml (merge (dict "severity" (index . 1)) (default (dict) $r.alertLabels)) }}
{{- end }}
