{{/*
Kafka, topics, consumer groups and decision signing (docs/deploy.md §2, docs/topics.md "Who can
make what happen"): one place for the flags, files and volumes they add to each component.

Files in every component's container:
  /etc/preemptctl/kafka/client.properties   the client properties (Secret <fullname>-kafka-client)
  /etc/preemptctl/kafka-ca/                 kafka.caSecret (the brokers' CA)
  /etc/preemptctl/kafka-user/               the component's credentials (kafka.userSecrets.<c>,
                                            or its Strimzi KafkaUser's Secret)
  /etc/preemptctl/signing/                  signing keys: the worker its active (private) key;
                                            the actuator every accepted public key (ed25519:
                                            ConfigMap FULLNAME-signing-public) or, in the HMAC
                                            compatibility mode, every shared key
*/}}

{{- define "preemptctl.kafka.strimziUsers" -}}
{{- if and .Values.strimzi.enabled .Values.strimzi.users.enabled }}true{{ end -}}
{{- end -}}

{{/* Topics are the operator's (or Strimzi's): the components only check them. */}}
{{- define "preemptctl.topics.external" -}}
{{- if or (not .Values.topics.create) (and .Values.strimzi.enabled .Values.strimzi.topics.enabled) }}true{{ end -}}
{{- end -}}

{{/* The client properties: Strimzi's defaults (with strimzi.users), then kafka.properties over them. */}}
{{- define "preemptctl.kafka.properties" -}}
{{- $props := dict -}}
{{- if include "preemptctl.kafka.strimziUsers" . }}
{{- if eq .Values.strimzi.users.authentication "tls" }}
{{- $_ := set $props "security.protocol" "SSL" }}
{{- $_ := set $props "ssl.certificate.location" "/etc/preemptctl/kafka-user/user.crt" }}
{{- $_ := set $props "ssl.key.location" "/etc/preemptctl/kafka-user/user.key" }}
{{- else }}
{{- $_ := set $props "security.protocol" "SASL_SSL" }}
{{- $_ := set $props "sasl.mechanism" "SCRAM-SHA-512" }}
{{- $_ := set $props "sasl.jaas.config" "${directory:/etc/preemptctl/kafka-user:sasl.jaas.config}" }}
{{- end }}
{{- end }}
{{- if .Values.kafka.caSecret }}
{{- $_ := set $props "ssl.ca.location" "/etc/preemptctl/kafka-ca/ca.crt" }}
{{- end }}
{{- toYaml (merge (deepCopy (.Values.kafka.properties | default dict)) $props) -}}
{{- end -}}

{{- define "preemptctl.kafka.hasProperties" -}}
{{- if (include "preemptctl.kafka.properties" . | fromYaml) }}true{{ end -}}
{{- end -}}

{{/* A component's Kafka credentials Secret, if any. (list . "component") */}}
{{- define "preemptctl.kafka.userSecret" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- $given := index ($ctx.Values.kafka.userSecrets | default dict) $component | default "" -}}
{{- if $given -}}
{{- $given -}}
{{- else if include "preemptctl.kafka.strimziUsers" $ctx -}}
{{- printf "%s-%s" (include "preemptctl.fullname" $ctx) $component -}}
{{- end -}}
{{- end -}}

{{- define "preemptctl.groups.worker" -}}
{{- .Values.groups.worker -}}
{{- end -}}

{{- define "preemptctl.groups.actuator" -}}
{{- .Values.groups.actuator | default (printf "preemptctl-actuator-%s" .Values.cluster) -}}
{{- end -}}

{{/* The signing Secret: the user's, else the one the chart generates. */}}
{{- define "preemptctl.signing.secret" -}}
{{- .Values.signing.existingSecret | default (printf "%s-signing" (include "preemptctl.fullname" .)) -}}
{{- end -}}

{{/* Flags every component takes for Kafka and its topics. (list . "component") */}}
{{- define "preemptctl.kafka.args" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
- {{ printf "--bootstrap-server=%v" $ctx.Values.kafka.bootstrapServers | quote }}
- {{ printf "--bootstrap-timeout=%v" $ctx.Values.kafka.bootstrapTimeoutSeconds | quote }}
{{- if include "preemptctl.kafka.hasProperties" $ctx }}
- "--kafka-config=/etc/preemptctl/kafka/client.properties"
{{- end }}
- {{ printf "--topic-prefix=%v" $ctx.Values.topics.prefix | quote }}
{{- if include "preemptctl.topics.external" $ctx }}
- "--no-create-topics"
{{- else }}
- {{ printf "--replication-factor=%v" $ctx.Values.topics.replicationFactor | quote }}
- {{ printf "--min-insync-replicas=%v" $ctx.Values.topics.minInsyncReplicas | quote }}
{{- end }}
{{- if eq $component "worker" }}
- {{ printf "--group-id=%v" (include "preemptctl.groups.worker" $ctx) | quote }}
{{- if $ctx.Values.signing.enabled }}
{{- /* The worker tells an Ed25519 PEM key from a shared HMAC key by its content. */}}
- {{ printf "--hmac-key-file=/etc/preemptctl/signing/%v" $ctx.Values.signing.activeKeyId | quote }}
- {{ printf "--hmac-key-id=%v" $ctx.Values.signing.activeKeyId | quote }}
{{- end }}
{{- with $ctx.Values.signing.installId }}
- {{ printf "--install-id=%v" . | quote }}
{{- end }}
{{- with $ctx.Values.tables }}
{{- if .enabled }}
- {{ printf "--tables-port=%v" .port | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq $component "actuator" }}
- {{ printf "--group-id=%v" (include "preemptctl.groups.actuator" $ctx) | quote }}
- {{ printf "--lag-group-id=%v" (include "preemptctl.groups.worker" $ctx) | quote }}
{{- if and $ctx.Values.signing.enabled (eq $ctx.Values.signing.mode "hmac") }}
- "--hmac-keys-dir=/etc/preemptctl/signing"
{{- else if $ctx.Values.signing.enabled }}
- "--signing-keys-dir=/etc/preemptctl/signing"
{{- end }}
{{- with $ctx.Values.signing.installId }}
- {{ printf "--install-id=%v" . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The volume mounts of those files. (list . "component") */}}
{{- define "preemptctl.kafka.volumeMounts" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- if include "preemptctl.kafka.hasProperties" $ctx }}
- name: kafka-client
  mountPath: /etc/preemptctl/kafka
  readOnly: true
{{- end }}
{{- if $ctx.Values.kafka.caSecret }}
- name: kafka-ca
  mountPath: /etc/preemptctl/kafka-ca
  readOnly: true
{{- end }}
{{- if include "preemptctl.kafka.userSecret" (list $ctx $component) }}
- name: kafka-user
  mountPath: /etc/preemptctl/kafka-user
  readOnly: true
{{- end }}
{{- if and $ctx.Values.signing.enabled (has $component (list "worker" "actuator")) }}
- name: signing
  mountPath: /etc/preemptctl/signing
  readOnly: true
{{- end }}
{{- end -}}

{{/* The volumes behind them. (list . "component") */}}
{{- define "preemptctl.kafka.volumes" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- if include "preemptctl.kafka.hasProperties" $ctx }}
- name: kafka-client
  secret:
    secretName: {{ printf "%s-kafka-client" (include "preemptctl.fullname" $ctx) | quote }}
{{- end }}
{{- with $ctx.Values.kafka.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ . | quote }}
{{- end }}
{{- with include "preemptctl.kafka.userSecret" (list $ctx $component) }}
- name: kafka-user
  secret:
    secretName: {{ . | quote }}
{{- end }}
{{- if and $ctx.Values.signing.enabled (eq $component "worker") }}
# Only the key it signs with: a worker never holds the keys it does not use.
- name: signing
  secret:
    secretName: {{ include "preemptctl.signing.secret" $ctx | quote }}
    items:
      - key: {{ $ctx.Values.signing.activeKeyId | quote }}
        path: {{ $ctx.Values.signing.activeKeyId | quote }}
{{- else if and $ctx.Values.signing.enabled (eq $component "actuator") (eq $ctx.Values.signing.mode "hmac") }}
# HMAC compatibility mode: every accepted shared key (an actuator could sign with one).
- name: signing
  secret:
    secretName: {{ include "preemptctl.signing.secret" $ctx | quote }}
{{- else if and $ctx.Values.signing.enabled (eq $component "actuator") }}
# The public keys only: an actuator can verify a decision, never sign one.
- name: signing
  configMap:
    name: {{ printf "%s-signing-public" (include "preemptctl.fullname" $ctx) | quote }}
{{- end }}
{{- end -}}

{{/* A pod annotation that changes with the client properties: a change rolls the pods. Not their
plain SHA-256, which an inline password (kafka.properties) could be guessed back from at billions
of tries a second: the properties go through scrypt (sprig's derivePassword: N=32768, r=8),
salted with the release's namespace and fullname, then SHA-256. Keep passwords out of values
anyway: ${directory:...} names a Secret's file (docs/deploy.md section 2). */}}
{{- define "preemptctl.kafka.checksum" -}}
{{- $salt := printf "%s/%s" .Release.Namespace (include "preemptctl.fullname" .) -}}
{{- derivePassword 1 "maximum" (include "preemptctl.kafka.properties" .) $salt "preemptctl.io/kafka-checksum" | sha256sum -}}
{{- end -}}

{{/* The topics and their configs (streams/kafka/topics.py's topic_specs; a test keeps them equal). */}}
{{- define "preemptctl.topics.specs" -}}
topics:
  - name: cluster-events
    config: {cleanup.policy: delete, retention.ms: "7776000000", max.message.bytes: "2097152"}
  - name: decisions
    config: {cleanup.policy: delete, retention.ms: "7776000000", max.message.bytes: "2097152"}
  - name: evictions
    config: {cleanup.policy: delete, retention.ms: "7776000000"}
  - name: dead-letter
    config: {cleanup.policy: delete, retention.ms: "2592000000", max.message.bytes: "2097152"}
  - name: snapshots
    config: {cleanup.policy: compact, segment.ms: "21600000", max.message.bytes: "2097152"}
{{- end -}}

{{/* The client properties as a .properties file, one key=value a line, keys sorted. */}}
{{- define "preemptctl.kafka.propertiesFile" -}}
{{- range $key, $value := (include "preemptctl.kafka.properties" . | fromYaml) }}
{{ printf "%s=%v" $key $value }}
{{- end }}
{{- end -}}

{{/* A list of port numbers as NetworkPolicy ports (TCP). */}}
{{- define "preemptctl.tcpPorts" -}}
{{- $ports := list -}}
{{- range . }}{{ $ports = append $ports (dict "port" . "protocol" "TCP") }}{{ end -}}
{{- toYaml $ports -}}
{{- end -}}


{{/* The topic prefix may not nest with the default's or another install's (topics.otherInstallPrefixes):
a prefix ACL on the shorter one grants read, Create and transactional ids on the longer one's topics
(docs/deploy.md §8). Equal to the default is this install being it. */}}
{{- define "preemptctl.topics.checkPrefix" -}}
{{- $prefix := .Values.topics.prefix -}}
{{- range $other := .Values.topics.otherInstallPrefixes | default list }}
{{- if eq $other $prefix }}
{{- fail (printf "topics.prefix %q is also another install's (topics.otherInstallPrefixes): two installs on one Kafka need two prefixes that do not nest (docs/deploy.md, \"Several installs on one Kafka\")" $prefix) }}
{{- end }}
{{- end }}
{{- range $other := prepend (.Values.topics.otherInstallPrefixes | default list) "preemption." }}
{{- if and (ne $other $prefix) (or (hasPrefix $other $prefix) (hasPrefix $prefix $other)) }}
{{- fail (printf "topics.prefix %q nests with %q (%s): a prefix ACL on the shorter one grants read, Create and transactional ids on every topic of the longer one. Choose prefixes neither of which begins with the other, e.g. preemption-staging. beside preemption. (docs/deploy.md, \"Several installs on one Kafka\")" $prefix $other (ternary "the default prefix" "another install's, topics.otherInstallPrefixes" (eq $other "preemption."))) }}
{{- end }}
{{- end }}
{{- end -}}
