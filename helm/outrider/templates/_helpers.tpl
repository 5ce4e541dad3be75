{{/* Names and labels. */}}
{{- define "outrider.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outrider.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "outrider.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "outrider.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "outrider.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outrider.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outrider.labels" -}}
{{ include "outrider.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "outrider.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Hardened container security context: non-root, read-only root, no privilege escalation, no capabilities. */}}
{{- define "outrider.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Environment every agent container gets: Downward API identity, OTLP, metrics auth, secrets. */}}
{{- define "outrider.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
- name: OUTRIDER_CONFIG
  value: /etc/outrider/outrider.yaml
- name: OUTRIDER_LISTEN
  value: {{ printf "0.0.0.0:%v" .Values.port | quote }}
- name: OUTRIDER_STATE_DIR
  value: /var/lib/outrider
{{- if .Values.otlp.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otlp.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .Values.otlp.protocol | quote }}
- name: OTEL_METRIC_EXPORT_INTERVAL
  value: {{ mul .Values.otlp.intervalSeconds 1000 | quote }}
{{- with .Values.otlp.resourceAttributes }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ include "outrider.kvlist" . | quote }}
{{- end }}
{{- end }}
{{- if .Values.metricsAuth.tlsSecretName }}
- name: OUTRIDER_TLS_CERT_FILE
  value: /etc/outrider/tls/tls.crt
- name: OUTRIDER_TLS_KEY_FILE
  value: /etc/outrider/tls/tls.key
{{- end }}
{{- if .Values.metricsAuth.basicAuthUsername }}
- name: OUTRIDER_BASIC_AUTH_USERNAME
  value: {{ .Values.metricsAuth.basicAuthUsername | quote }}
- name: OUTRIDER_BASIC_AUTH_PASSWORD_FILE
  value: /etc/outrider/basic-auth/password
{{- end }}
{{- range $name, $ref := .Values.secretEnv }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef: {name: {{ $ref.secretName | quote }}, key: {{ $ref.key | quote }}}
{{- end }}
{{- end -}}

{{- define "outrider.kvlist" -}}
{{- $pairs := list -}}
{{- range $k, $v := . -}}{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* Probes on the agent's own endpoints. */}}
{{- define "outrider.probes" -}}
{{- $scheme := ternary "HTTPS" "HTTP" (ne .Values.metricsAuth.tlsSecretName "") -}}
readinessProbe:
  httpGet: {path: /readyz, port: metrics, scheme: {{ $scheme }}}
  periodSeconds: 10
livenessProbe:
  httpGet: {path: /healthz, port: metrics, scheme: {{ $scheme }}}
  periodSeconds: 30
  failureThreshold: 3
{{- end -}}

{{/* Volume mounts and volumes shared by the node agent and the sidecar. */}}
{{- define "outrider.volumeMounts" -}}
- name: outrider-config
  mountPath: /etc/outrider/outrider.yaml
  subPath: outrider.yaml
  readOnly: true
- name: outrider-tmp
  mountPath: /tmp
- name: outrider-state
  mountPath: /var/lib/outrider
{{- if .Values.metricsAuth.tlsSecretName }}
- name: outrider-tls
  mountPath: /etc/outrider/tls
  readOnly: true
{{- end }}
{{- if .Values.metricsAuth.basicAuthUsername }}
- name: outrider-basic-auth
  mountPath: /etc/outrider/basic-auth
  readOnly: true
{{- end }}
{{- end -}}

{{- define "outrider.volumes" -}}
- name: outrider-config
  configMap:
    name: {{ include "outrider.fullname" . }}
- name: outrider-tmp
  emptyDir: {}
{{- /* Alert state and the notification outbox: they outlive a container restart in an emptyDir, and a pod's
       replacement on the same node with state.hostPath. */}}
- name: outrider-state
{{- if .Values.state.hostPath }}
  hostPath: {path: {{ .Values.state.hostPath | quote }}, type: DirectoryOrCreate}
{{- else }}
  emptyDir: {}
{{- end }}
{{- if .Values.metricsAuth.tlsSecretName }}
- name: outrider-tls
  secret:
    secretName: {{ .Values.metricsAuth.tlsSecretName }}
{{- end }}
{{- if .Values.metricsAuth.basicAuthUsername }}
- name: outrider-basic-auth
  secret:
    secretName: {{ .Values.metricsAuth.basicAuthPasswordSecretName }}
    items: [{key: password, path: password}]
{{- end }}
{{- end -}}

{{/*
The sidecar for users' workloads. In your pod template:
  spec:
    shareProcessNamespace: true
    containers:
      - name: trainer
        env: [{name: OUTRIDER_SPOOL_DIR, value: /var/run/outrider}]
        volumeMounts: [{name: outrider-spool, mountPath: /var/run/outrider}]
      {{- include "outrider.sidecar" . | nindent 6 }}
    volumes:
      {{- include "outrider.sidecarVolumes" . | nindent 6 }}
*/}}
{{- define "outrider.sidecar" -}}
- name: outrider
  image: {{ include "outrider.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["agent"]
  env:
    {{- include "outrider.env" . | nindent 4 }}
    - name: OUTRIDER_SPOOL_DIR
      value: {{ .Values.sidecar.spoolDir | quote }}
  ports:
    - {name: metrics, containerPort: {{ .Values.port }}, protocol: TCP}
  {{- include "outrider.probes" . | nindent 2 }}
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  securityContext:
    {{- include "outrider.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    {{- include "outrider.volumeMounts" . | nindent 4 }}
    - name: outrider-spool
      mountPath: {{ .Values.sidecar.spoolDir }}
{{- end -}}

{{- define "outrider.sidecarVolumes" -}}
{{ include "outrider.volumes" . }}
- name: outrider-spool
  emptyDir: {sizeLimit: 64Mi}
{{- end -}}
