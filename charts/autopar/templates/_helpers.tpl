{{/* Names, labels and images shared by the templates. */}}

{{- define "autopar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "autopar.fullname" -}}
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

{{- define "autopar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autopar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "autopar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "autopar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: autopar
{{- end }}

{{- define "autopar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "autopar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository@digest, or :tag (default: the chart's appVersion). */}}
{{- define "autopar.imageRef" -}}
{{- $img := index . 0 }}{{- $chart := index . 1 }}
{{- $repo := ternary (printf "%s/%s" $img.registry $img.repository) $img.repository (ne (default "" $img.registry) "") }}
{{- if $img.digest }}
{{- printf "%s@%s" $repo $img.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default $chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "autopar.image" -}}
{{- include "autopar.imageRef" (list .Values.image .Chart) }}
{{- end }}

{{- define "autopar.trainerImage" -}}
{{- include "autopar.imageRef" (list .Values.trainerImage .Chart) }}
{{- end }}

{{/* kopf peering: only with more than one replica (standalone otherwise). */}}
{{- define "autopar.peering" -}}
{{- if gt (int .Values.replicaCount) 1 }}
{{- default (include "autopar.fullname" .) .Values.peering.name }}
{{- end }}
{{- end }}
