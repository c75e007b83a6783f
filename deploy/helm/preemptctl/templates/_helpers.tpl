{{/*
Names, labels and the pod spec parts every component shares.

Names: `fullname` is fullnameOverride, else the release name (what every object was named
before fullnameOverride existed: a new default would rename the worker's StatefulSet and
orphan its volume claims on upgrade). Cluster-scoped objects (ClusterRole, ClusterRoleBinding)
also carry the release namespace, so one release name in two namespaces does not collide.
*/}}
{{- define "preemptctl.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "preemptctl.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "preemptctl.fullname" .) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: never change (a Deployment's selector is immutable). (list . "component") */}}
{{- define "preemptctl.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: preemptctl
app.kubernetes.io/instance: {{ $ctx.Release.Name | quote }}
app.kubernetes.io/component: {{ index . 1 | quote }}
{{- end -}}

{{/* Every object's labels: Kubernetes' recommended set and Helm's chart label. (list . "component") */}}
{{- define "preemptctl.labels" -}}
{{- $ctx := index . 0 -}}
{{ include "preemptctl.selectorLabels" . }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: preemptctl
app.kubernetes.io/managed-by: {{ $ctx.Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The image: a digest pins it; else the tag, which defaults to the chart's appVersion. */}}
{{- define "preemptctl.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* A ServiceAccount's annotations: the shared ones, then the component's. (list . "component") */}}
{{- define "preemptctl.serviceAccountAnnotations" -}}
{{- $ctx := index . 0 -}}
{{- $own := (index $ctx.Values (index . 1)).serviceAccount | default dict -}}
{{- $merged := merge (deepCopy ($own.annotations | default dict)) ($ctx.Values.serviceAccount.annotations | default dict) -}}
{{- with $merged }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod spec fields every component shares (scheduling, pull secrets, priority). */}}
{{- define "preemptctl.podScheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The pod annotations every component shares: the scrape hints, then the user's. */}}
{{- define "preemptctl.podAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metricsPort | quote }}
prometheus.io/path: /metrics
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The actuator's explicit choice between dry run and acting (values.yaml, actuator.mode). */}}
{{- define "preemptctl.actuatorMode" -}}
{{- required "actuator.mode must be chosen: --set actuator.mode=dry-run (every write is sent with dryRun=All: the API server checks it and nothing changes) or --set actuator.mode=act (victims are deleted, evicted or labelled). docs/deploy.md §1" .Values.actuator.mode -}}
{{- end -}}

{{/* Logging flags, the same on every component. */}}
{{- define "preemptctl.logArgs" -}}
- {{ printf "--log-level=%v" .Values.logging.level | quote }}
- {{ printf "--log-format=%v" .Values.logging.format | quote }}
{{- end -}}
