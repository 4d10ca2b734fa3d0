{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of a component: (dict "root" $ "component" "center") */}}
{{- define "sluice.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sluice.labels" -}}
{{ include "sluice.selector" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "sluice.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s/%s:%s" .root.Values.image.registry .image $tag -}}
{{- end -}}

{{/* Refuses values that would give a pod a config its service rejects, or a secret in a ConfigMap. */}}
{{- define "sluice.validate" -}}
{{- if lt (int .Values.center.replicas) 2 }}
{{- fail "center.replicas must be at least 2: one center leads, the others stand by to take over" }}
{{- end }}
{{- $_ := required "meta.passwordSecret.name is required (an existing Secret)" .Values.meta.passwordSecret.name }}
{{- if not (has .Values.api.auth (list "token" "mtls" "none")) }}
{{- fail (printf "api.auth must be token, mtls or none, not %q" .Values.api.auth) }}
{{- end }}
{{- if eq .Values.api.auth "token" }}
{{- $_ := required "api.tokenSecret.name is required for token auth (an existing Secret)" .Values.api.tokenSecret.name }}
{{- end }}
{{- if and (not .Values.api.tlsSecret) (not .Values.api.allowPlaintext) }}
{{- fail "api.tlsSecret is required: without it tokens, passwords and session cookies cross the network in clear (set api.allowPlaintext=true where a service mesh or a proxy in front encrypts)" }}
{{- end }}
{{- if eq .Values.api.auth "none" }}
{{- fail "api.auth none makes every caller an admin: the centers listen on the pod network, so choose token or mtls" }}
{{- end }}
{{- if and (eq .Values.api.auth "mtls") (not .Values.api.tlsSecret) }}
{{- fail "api.tlsSecret is required for mtls auth (an existing Secret with tls.crt, tls.key and ca.crt)" }}
{{- end }}
{{- range $k, $_ := .Values.kafka.properties }}
{{- if or (contains "password" (lower $k)) (contains "secret" (lower $k)) }}
{{- fail (printf "kafka.properties.%s would put a secret in a ConfigMap: use kafka.saslPasswordSecret (sasl.password) or a mounted file" $k) }}
{{- end }}
{{- end }}
{{- range .Values.sourcePasswords }}
{{- if hasPrefix "SLUICE_" .env }}
{{- fail (printf "sourcePasswords: %s starts with SLUICE_, which the services read as config; choose another name" .env) }}
{{- end }}
{{- end }}
{{- range .Values.sourceSecrets.env }}
{{- if hasPrefix "SLUICE_" . }}
{{- fail (printf "sourceSecrets.env: %s would let sources name the services' own settings (SLUICE_ variables); choose another name" .) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The [zookeeper] and [telemetry] sections every component shares. */}}
{{- define "sluice.commonToml" -}}
[zookeeper]
connect = {{ required "zookeeper.connect is required" .Values.zookeeper.connect | toJson }}
root = {{ .Values.zookeeper.root | toJson }}
session_timeout = {{ .Values.zookeeper.sessionTimeout | toJson }}

[telemetry]
listen = {{ printf "0.0.0.0:%v" .Values.telemetry.metricsPort | toJson }}
{{- with .Values.telemetry.otlpEndpoint }}
otlp_endpoint = {{ . | toJson }}
{{- end }}
{{- end -}}

{{- define "sluice.kafkaToml" -}}
[kafka]
brokers = {{ required "kafka.brokers is required" .Values.kafka.brokers | toJson }}
partitions = {{ .Values.kafka.partitions }}
replication_factor = {{ .Values.kafka.replicationFactor }}
{{- with .Values.kafka.properties }}

[kafka.properties]
{{- range $k, $v := . }}
{{ $k | toJson }} = {{ $v | toString | toJson }}
{{- end }}
{{- end }}

[topics]
rows = {{ .Values.topics.rows | toJson }}
dead_letter = {{ .Values.topics.deadLetter | toJson }}
delayed = {{ .Values.topics.delayed | toJson }}
{{- end -}}

{{- define "sluice.esToml" -}}
[elasticsearch]
url = {{ required "elasticsearch.url is required" .Values.elasticsearch.url | toJson }}
request_timeout = {{ .Values.elasticsearch.requestTimeout | toJson }}
{{- with .Values.elasticsearch.username }}
username = {{ . | toJson }}
{{- end }}
{{- end -}}

{{/* How every component reaches the sources the center keeps (top-level keys, so
before any section): the secrets their password_ref may name — the sourcePasswords
variables, sourceSecrets.env and sourceSecrets.dirs, nothing else — and the hosts a
password may go to without TLS (mysql.plaintextHosts). */}}
{{- define "sluice.sourceAccessToml" -}}
{{- $env := list -}}
{{- range .Values.sourcePasswords }}{{ $env = append $env .env }}{{ end -}}
{{- range .Values.sourceSecrets.env }}{{ $env = append $env . }}{{ end -}}
source_plaintext_hosts = {{ .Values.mysql.plaintextHosts | default list | toJson }}
source_secrets = { env = {{ $env | toJson }}, dirs = {{ .Values.sourceSecrets.dirs | default list | toJson }} }
{{- end -}}

{{/* Each component's config.toml. Secrets are never here: they come as SLUICE_* env from Secrets. */}}
{{- define "sluice.centerToml" -}}
{{ include "sluice.sourceAccessToml" . }}

[center]
listen = {{ printf "0.0.0.0:%v" .Values.center.grpcPort | toJson }}
dictionary_listen = {{ printf "0.0.0.0:%v" .Values.center.dictionaryPort | toJson }}
console_listen = {{ printf "0.0.0.0:%v" .Values.center.consolePort | toJson }}

{{ include "sluice.commonToml" . }}

[meta]
host = {{ required "meta.host is required" .Values.meta.host | toJson }}
port = {{ .Values.meta.port }}
user = {{ .Values.meta.user | toJson }}
database = {{ .Values.meta.database | toJson }}
{{- if .Values.meta.allowPlaintext }}
allow_plaintext = true
{{- end }}

[api]
auth = {{ .Values.api.auth | toJson }}
{{- if .Values.api.allowPlaintext }}
allow_plaintext = true
{{- end }}
{{- if .Values.api.tlsSecret }}
tls_cert = "/etc/sluice/tls/tls.crt"
tls_key = "/etc/sluice/tls/tls.key"
{{- if eq .Values.api.auth "mtls" }}
client_ca = "/etc/sluice/tls/ca.crt"
{{- end }}
{{- end }}

{{- with .Values.center.search }}
{{- if .enabled }}

[search]
listen = {{ printf "0.0.0.0:%v" .port | toJson }}
max_wait = {{ .maxWait | toJson }}
{{- range .apps }}
[[search.apps]]
name = {{ required "center.search.apps[].name is required" .name | toJson }}
token_sha256 = {{ required "center.search.apps[].tokenSha256 is required" .tokenSha256 | toJson }}
aliases = {{ .aliases | default list | toJson }}
templates = {{ .templates | default list | toJson }}
{{- if .ratePerSec }}
rate_per_sec = {{ .ratePerSec }}
{{- end }}
{{- if .burst }}
burst = {{ .burst }}
{{- end }}
{{- end }}
{{- range .templates }}
[[search.templates]]
name = {{ required "center.search.templates[].name is required" .name | toJson }}
params = {{ .params | default dict | toJson | toJson }}
query = {{ required "center.search.templates[].query is required" .query | toJson | toJson }}
{{- end }}
{{- end }}
{{- end }}

[balance]
threshold = {{ .Values.center.balance.threshold }}
settle = {{ .Values.center.balance.settle | toJson }}
resync = {{ .Values.center.balance.resync | toJson }}

{{ include "sluice.esToml" . }}

{{/* To list and replay dead letters (`sluicectl dlq`). */}}
{{ include "sluice.kafkaToml" . }}
{{- end -}}

{{- define "sluice.workerToml" -}}
{{ include "sluice.sourceAccessToml" . }}

[worker]
capacity = {{ .Values.worker.capacity }}
drain_timeout = {{ .Values.worker.drainTimeout | toJson }}

{{ include "sluice.commonToml" . }}

{{ include "sluice.kafkaToml" . }}

{{/* Consistency checks compare the index with MySQL. */}}
{{ include "sluice.esToml" . }}
{{- if .Values.api.tlsSecret }}

[center]
tls_ca = "/etc/sluice/tls/ca.crt"
{{- if eq .Values.api.auth "mtls" }}
tls_cert = "/etc/sluice/tls/tls.crt"
tls_key = "/etc/sluice/tls/tls.key"
{{- end }}
{{- end }}
{{- end -}}

{{- define "sluice.etlToml" -}}
{{ include "sluice.sourceAccessToml" . }}

[etl]
group_id = {{ .Values.etl.groupId | toJson }}

{{ include "sluice.commonToml" . }}

{{ include "sluice.kafkaToml" . }}

{{ include "sluice.esToml" . }}
{{- end -}}

{{/* The workers' report-only token: the Secret the values name (api.workerTokenSecret), or
the one this chart makes (templates/worker-token.yaml). Never the admin token. As JSON:
fromJson (include "sluice.workerTokenSecret" .) */}}
{{- define "sluice.workerTokenSecret" -}}
{{- if .Values.api.workerTokenSecret.name -}}
{{- toJson .Values.api.workerTokenSecret -}}
{{- else -}}
{{- toJson (dict "name" (printf "%s-worker-token" (include "sluice.fullname" .)) "key" "token") -}}
{{- end -}}
{{- end -}}

{{/* An env var from an existing Secret: (dict "name" "SLUICE_..." "secret" .Values.x.passwordSecret) */}}
{{- define "sluice.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret.name }}
      key: {{ .secret.key }}
{{- end -}}

{{/* Source passwords: centers (to check pipelines against the tables), workers (to
stream) and the etl (to read documents back) resolve sources' `env:NAME` references. */}}
{{- define "sluice.sourcePasswordEnv" -}}
{{- range .Values.sourcePasswords }}
{{ include "sluice.secretEnv" (dict "name" .env "secret" (dict "name" .secretName "key" .secretKey)) }}
{{- end }}
{{- end -}}

{{/* Log settings every container gets (SLUICE_LOG_FORMAT is read by the services, not as config). */}}
{{- define "sluice.logEnv" -}}
- name: RUST_LOG
  value: {{ .Values.log.level | quote }}
{{- if eq .Values.log.format "json" }}
- name: SLUICE_LOG_FORMAT
  value: json
{{- end }}
{{- end -}}

{{/* ZooKeeper's digest credential, which every service of the cluster shares. */}}
{{- define "sluice.zookeeperEnv" -}}
{{- if .Values.zookeeper.authSecret.name }}
{{ include "sluice.secretEnv" (dict "name" "SLUICE_ZOOKEEPER__AUTH" "secret" .Values.zookeeper.authSecret) }}
{{- end }}
{{- end -}}

{{/* Probes on the telemetry endpoint: live while the process runs, ready while it takes work. */}}
{{- define "sluice.probes" -}}
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 10
  failureThreshold: 6
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}

{{/* Pod-level settings shared by the components: (dict "root" $ "values" .Values.center) */}}
{{- define "sluice.podCommon" -}}
securityContext: {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The config file; with api.tlsSecret, the API certificates; with mysql.tlsSecret, MySQL's
CA; with elasticsearch.tlsSecret, Elasticsearch's for components that write to it:
(dict "root" $ "values" .Values.worker "tls" true "es" false) */}}
{{- define "sluice.volumeMounts" -}}
- {name: config, mountPath: /etc/sluice/config.toml, subPath: config.toml, readOnly: true}
{{- if and .tls .root.Values.api.tlsSecret }}
- {name: tls, mountPath: /etc/sluice/tls, readOnly: true}
{{- end }}
{{- if .root.Values.mysql.tlsSecret }}
- {name: mysql-tls, mountPath: /etc/sluice/mysql-tls, readOnly: true}
{{- end }}
{{- if and .es .root.Values.elasticsearch.tlsSecret }}
- {name: es-tls, mountPath: /etc/sluice/es-tls, readOnly: true}
{{- end }}
{{- with .values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sluice.volumes" -}}
- name: config
  configMap: {name: {{ include "sluice.fullname" .root }}-{{ .component }}}
{{- if and .tls .root.Values.api.tlsSecret }}
- name: tls
  secret: {secretName: {{ .root.Values.api.tlsSecret }}}
{{- end }}
{{- if .root.Values.mysql.tlsSecret }}
- name: mysql-tls
  secret: {secretName: {{ .root.Values.mysql.tlsSecret }}}
{{- end }}
{{- if and .es .root.Values.elasticsearch.tlsSecret }}
- name: es-tls
  secret: {secretName: {{ .root.Values.elasticsearch.tlsSecret }}}
{{- end }}
{{- with .values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* TLS files from a mounted Secret, as `SLUICE_<key>__CA` (…CERT, …KEY with a client
certificate): (dict "key" "SOURCE_TLS" "tls" .Values.mysql "dir" "mysql-tls") */}}
{{- define "sluice.tlsEnv" -}}
{{- if .tls.tlsSecret }}
- name: SLUICE_{{ .key }}__CA
  value: /etc/sluice/{{ .dir }}/ca.pem
{{- if .tls.clientCertificate }}
- name: SLUICE_{{ .key }}__CERT
  value: /etc/sluice/{{ .dir }}/client.pem
- name: SLUICE_{{ .key }}__KEY
  value: /etc/sluice/{{ .dir }}/client.key
{{- end }}
{{- end }}
{{- end -}}
