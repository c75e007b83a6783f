{{/*
Names, labels and the pod spec parts every component shares.

Names: `fullname` is fullnameOverride, else the release name (what every object was named
before fullnameOverride existed: a new default would rename the worker's StatefulSet and
orphan its volume claims on upgrade). Cluster-scoped objects (ClusterRole, ClusterRoleBinding)
also carry the release namespace, so one release name in two namespaces does not collide.
*/}}
{{- define "preemptctl.fullname" -}}
{{- $name := include "preemptctl.name" . -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if or (eq $name "preemptctl") (contains $name .Release.Name) -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The chart's name: nameOverride, else the chart's name, which is the alias when an umbrella chart
names this one as a dependency under an alias. It is app.kubernetes.io/name, so two aliases of the
chart in one umbrella release select disjoint pods; a name other than "preemptctl" (an alias, or
nameOverride) also makes the fullname RELEASE-NAME, so their objects do not collide either.
*/}}
{{- define "preemptctl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
A component's Lease (list . "component"): <component>.leaseName, else FULLNAME-<component>, so two
releases (or two aliases) in one namespace never contend for one Lease.
*/}}
{{- define "preemptctl.leaseName" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- (index $ctx.Values $component).leaseName | default (printf "%s-%s" (include "preemptctl.fullname" $ctx) $component) -}}
{{- end -}}

{{/*
A component's ServiceAccount (list . "component"): <component>.serviceAccount.name, else
FULLNAME-<component> (the chart's own when serviceAccount.create, else one you made).
*/}}
{{- define "preemptctl.serviceAccountName" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- $own := (index $ctx.Values $component).serviceAccount | default dict -}}
{{- $own.name | default (printf "%s-%s" (include "preemptctl.fullname" $ctx) $component) -}}
{{- end -}}

{{/*
The Lease timing rule the processes check at start (retryPeriod < renewDeadline < duration), checked
at render time too, so a GitOps sync fails instead of the pods crash-looping. The schema checks
each bound (renewDeadline above the 5 s write timeout; whole seconds of duration).
*/}}
{{- define "preemptctl.checkLease" -}}
{{- $l := .Values.lease -}}
{{- if not (and (lt (float64 $l.retryPeriodSeconds) (float64 $l.renewDeadlineSeconds)) (lt (float64 $l.renewDeadlineSeconds) (float64 $l.durationSeconds))) -}}
{{- fail (printf "lease: retryPeriodSeconds (%v) < renewDeadlineSeconds (%v) < durationSeconds (%v) must hold (docs/deploy.md, \"Leases and fencing\")" $l.retryPeriodSeconds $l.renewDeadlineSeconds $l.durationSeconds) -}}
{{- end -}}
{{- end -}}

{{- define "preemptctl.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "preemptctl.fullname" .) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: never change (a Deployment's selector is immutable). The name is
"preemptctl" unless nameOverride or an alias says otherwise, so a release's selectors stay what
they were. (list . "component") */}}
{{- define "preemptctl.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "preemptctl.name" $ctx | quote }}
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

{{/* The image: a digest pins it; else the tag, which defaults to the chart's appVersion.
global.imageRegistry (an umbrella chart's mirror) replaces the repository's registry: its first
path component when that names a host (a dot, a port or localhost), else it is put in front. */}}
{{- define "preemptctl.repository" -}}
{{- $repository := .Values.image.repository -}}
{{- $registry := (.Values.global | default dict).imageRegistry | default "" | trimSuffix "/" -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" $registry $repository -}}
{{- end -}}
{{- $repository -}}
{{- end -}}

{{- define "preemptctl.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" (include "preemptctl.repository" .) .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" (include "preemptctl.repository" .) (default .Chart.AppVersion .Values.image.tag) -}}
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

{{/* A pod template's labels: the component's labels, then podLabels (never over those). (list . "component") */}}
{{- define "preemptctl.podLabels" -}}
{{- $ctx := index . 0 -}}
{{- $labels := include "preemptctl.labels" . -}}
{{- $own := fromYaml $labels -}}
{{ $labels }}
{{- range $key, $value := $ctx.Values.podLabels }}
{{- if not (hasKey $own $key) }}
{{ $key | quote }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The container's probes on the metrics port, with probes.liveness and probes.readiness timings. */}}
{{- define "preemptctl.probes" -}}
livenessProbe:
  httpGet:
    path: /livez
    port: metrics
  {{- with .Values.probes.liveness }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- with .Values.probes.readiness }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* Volumes every component has: a writable /tmp (the root filesystem is read-only; the Kafka
client writes a PKCS12 keystore's chain there for an instant), then extraVolumes. */}}
{{- define "preemptctl.commonVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmp.sizeLimit | quote }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "preemptctl.commonVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
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

{{/* Signing off: the actuator refuses to start without keys unless --accept-unsigned
(actuator.acceptUnsigned), which means nothing with signing on. Checked at render. */}}
{{- define "preemptctl.checkUnsigned" -}}
{{- if and .Values.signing.enabled .Values.actuator.acceptUnsigned -}}
{{- fail "actuator.acceptUnsigned applies only with signing.enabled=false: with signing on, the actuator accepts signed decisions only (docs/deploy.md, \"Decision signing\")" -}}
{{- else if and (not .Values.signing.enabled) (not .Values.actuator.acceptUnsigned) -}}
{{- fail "signing.enabled=false: the actuator refuses to start without signing keys. To act on unsigned decisions (anyone who can write the decisions topic then chooses what is evicted) set actuator.acceptUnsigned=true as well; else keep signing on (docs/deploy.md, \"Decision signing\")" -}}
{{- end -}}
{{- end -}}
