{{/*
Chart name, truncated to 63 characters (a DNS label).
*/}}
{{- define "gpt2bench.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, truncated to 63 characters. If the release name already contains the chart
name, it is not repeated.
*/}}
{{/* The leader-election Lease (and its Role): one per release, in the operator's namespace. */}}
{{- define "gpt2bench.leaseName" -}}
{{- printf "%s-leader" (include "gpt2bench.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "gpt2bench.fullname" -}}
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

{{/*
Namespace of the namespaced objects.
*/}}
{{- define "gpt2bench.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Chart label: name and version.
*/}}
{{- define "gpt2bench.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels (helm.sh best practices).
*/}}
{{- define "gpt2bench.labels" -}}
helm.sh/chart: {{ include "gpt2bench.chart" . }}
{{ include "gpt2bench.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpt2bench
{{- end }}

{{/*
Selector labels of the operator. Trainer pods carry app.kubernetes.io/name=gpt2bench too, but no
instance label, so this selector never matches them.
*/}}
{{- define "gpt2bench.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpt2bench.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Operator labels: common labels plus the component.
*/}}
{{- define "gpt2bench.operator.labels" -}}
{{ include "gpt2bench.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gpt2bench.operator.selectorLabels" -}}
{{ include "gpt2bench.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Service account of the operator.
*/}}
{{- define "gpt2bench.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpt2bench.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The namespace the operator watches when it does not watch all of them.
*/}}
{{- define "gpt2bench.watchNamespace" -}}
{{- default (include "gpt2bench.namespace" .) .Values.operator.watchNamespace }}
{{- end }}

{{/*
An image reference: repository@digest when a digest is given (the tag is then not used), else
repository:tag. Takes (list repository tag digest).
*/}}
{{- define "gpt2bench.imageRef" -}}
{{- $repository := index . 0 }}{{- $tag := index . 1 }}{{- $digest := index . 2 }}
{{- if $digest }}
{{- printf "%s@%s" $repository $digest }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/*
Operator image reference; the tag defaults to the chart's appVersion, a digest wins over it.
*/}}
{{- define "gpt2bench.image" -}}
{{- include "gpt2bench.imageRef" (list .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) .Values.image.digest) }}
{{- end }}

{{/*
Trainer images by device type, for the runs whose GPT2Benchmark names none.
*/}}
{{- define "gpt2bench.trainerImage.cpu" -}}
{{- include "gpt2bench.imageRef" (list .Values.trainerImage.repository (.Values.trainerImage.tag | default .Chart.AppVersion) .Values.trainerImage.digest) }}
{{- end }}

{{- define "gpt2bench.trainerImage.gpu" -}}
{{- $cpu := .Values.trainerImage.tag | default .Chart.AppVersion }}
{{- include "gpt2bench.imageRef" (list .Values.trainerImage.repository (.Values.trainerImage.gpuTag | default (printf "%s-cuda" $cpu)) .Values.trainerImage.gpuDigest) }}
{{- end }}
