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

{{- define "muster.labels" -}}
helm.sh/chart: {{ include "muster.chartLabel" . }}
{{ include "muster.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller-manager
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

{{- define "muster.nodeAgentLabels" -}}
helm.sh/chart: {{ include "muster.chartLabel" . }}
{{ include "muster.nodeAgentSelectorLabels" . }}
app.kubernetes.io/part-of: {{ include "muster.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The node agent's ServiceAccount as the apiserver names it (the admission policy matches it). */}}
{{- define "muster.nodeAgentUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "muster.nodeAgentName" .) }}
{{- end }}

{{- define "muster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "muster.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "muster.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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
{{- define "muster.crdNames" -}}
- musterjobs.batch.muster.dev
- musterjobsets.batch.muster.dev
- workloads.scheduling.muster.dev
- podgroups.scheduling.muster.dev
- compositepodgroups.scheduling.muster.dev
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

{{/* muster's own namespace and kube-system never reach the webhooks (src/webhook/config.rs). */}}
{{- define "muster.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        - {{ .Release.Namespace }}
        - kube-system
{{- end }}
