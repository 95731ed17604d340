{{- define "tessera.fullname" -}}
{{- if contains "tessera" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tessera" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "tessera.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tessera.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tessera.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The rules the controller needs on namespaced resources (tessera-controller --print-permissions). */}}
{{- define "tessera.namespacedRules" -}}
- apiGroups: [tessera.dev]
  resources: [trainingjobs]
  verbs: [get, list, watch, delete]
- apiGroups: [tessera.dev]
  resources: [trainingjobs/status]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, update]
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}
