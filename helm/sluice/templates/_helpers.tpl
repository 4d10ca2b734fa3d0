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
{{- if .Values.kafka.properties }}

[kafka.properties]
{{- range $k, $v := .Values.kafka.properties }}
{{ $k | toJson }} = {{ $v | toString | toJson }}
{{- end }}
{{- end }}

[topics]
rows = {{ .Values.topics.rows | toJson }}
{{- end -}}

{{- define "sluice.esToml" -}}
[elasticsearch]
url = {{ required "elasticsearch.url is required" .Values.elasticsearch.url | toJson }}
request_timeout = {{ .Values.elasticsearch.requestTimeout | toJson }}
{{- with .Values.elasticsearch.username }}
username = {{ . | toJson }}
{{- end }}
{{- end -}}

{{/* An env var from an existing Secret: (dict "name" "SLUICE_..." "secret" .Values.x.passwordSecret) */}}
{{- define "sluice.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret.name }}
      key: {{ .secret.key }}
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

{{- define "sluice.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
securityContext: {{ toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
{{- end -}}
