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

{{/* Labels of the prometheus-operator objects: the chart's, monitoringLabels (what a Prometheus selects by, e.g.
     release: kube-prometheus-stack), then the object's own. . is (dict "top" $ "own" $labels). */}}
{{- define "outrider.monitoringLabels" -}}
{{ include "outrider.labels" .top }}
{{- with (merge (dict) (.own | default dict) .top.Values.monitoringLabels) }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* "true" where this chart renders as a dependency of another chart (a workload's chart that includes the sidecar):
     its templates' path is then PARENT/charts/outrider/templates. */}}
{{- define "outrider.isDependency" -}}
{{- if contains "/charts/" .Template.BasePath }}true{{ end -}}
{{- end -}}

{{/* "true" where a part whose `enabled` may be null is on: null is on where the chart is installed on its own and
     off where it is a dependency, which wants the sidecar only (the cluster's own install runs the node agents and
     provides the dashboards). . is (dict "enabled" VALUE "top" $). */}}
{{- define "outrider.enabled" -}}
{{- if kindIs "invalid" .enabled }}{{ if not (include "outrider.isDependency" .top) }}true{{ end }}
{{- else if .enabled }}true{{ end -}}
{{- end -}}

{{- define "outrider.nodeAgentEnabled" -}}
{{- include "outrider.enabled" (dict "enabled" .Values.nodeAgent.enabled "top" .) -}}
{{- end -}}

{{- define "outrider.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* A hash of the agent's configuration: a pod annotation, so a change rolls the pods. */}}
{{- define "outrider.configChecksum" -}}
{{- toYaml .Values.config | sha256sum -}}
{{- end -}}

{{/*
The scope the sidecar templates render with: this chart's own values, also when a parent chart that depends on
this one includes them. `.` may be
  - this chart's context (the examples),
  - a parent chart's context: the dependency's scope (.Subcharts.outrider) is used, so its defaults and whatever
    the parent's values set under `outrider:` apply (a parent's own `image` or `config` are not read),
  - (dict "context" $ "values" (dict ...) "subchart" "NAME"): the same, with values merged over the subchart's for
    this one workload, and NAME where the dependency has an alias.
Fills .out.scope. Go templates return only text, so the scope is passed back through a dict.
*/}}
{{- define "outrider.resolveScope" -}}
{{- $in := .in -}}
{{- $over := dict -}}
{{- $name := "outrider" -}}
{{- if hasKey $in "context" -}}
{{- $over = $in.values | default dict -}}
{{- $name = $in.subchart | default "outrider" -}}
{{- $in = $in.context -}}
{{- end -}}
{{- $scope := $in -}}
{{- if and $in.Subcharts (hasKey $in.Subcharts $name) -}}
{{- $scope = index $in.Subcharts $name -}}
{{- end -}}
{{- if $over -}}
{{- $values := mergeOverwrite (deepCopy $scope.Values) $over -}}
{{- $scope = dict "Values" $values "Chart" $scope.Chart "Release" $scope.Release "Capabilities" $scope.Capabilities "Template" $scope.Template "Files" $scope.Files -}}
{{- end -}}
{{- $_ := set .out "scope" $scope -}}
{{- end -}}

{{/* Hardened container security context: non-root (unless .uid is 0: the node agent's privileges), read-only root,
     no privilege escalation, no capabilities (but .add's: the node agent's all-processes), the runtime's seccomp
     profile (PodSecurity "restricted" as it stands). . is (dict "uid" UID "add" LIST). */}}
{{- define "outrider.containerSecurityContext" -}}
runAsNonRoot: {{ ne (int .uid) 0 }}
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
  {{- with .add }}
  add: {{ toJson . }}
  {{- end }}
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
{{- /* Both from files, which the agent reads again when the kubelet updates the Secret's volume (an environment
       variable would keep the old user until a restart). */}}
{{- if .Values.metricsAuth.basicAuthSecretName }}
- name: OUTRIDER_BASIC_AUTH_USERNAME_FILE
  value: /etc/outrider/basic-auth/username
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

{{/* Probes on the agent's own endpoints. The startup probe holds a native sidecar's workload back until the agent
     serves (and holds the spool's lock, so the workload only publishes and starts no agent of its own). */}}
{{- define "outrider.probes" -}}
{{- $scheme := ternary "HTTPS" "HTTP" (ne .Values.metricsAuth.tlsSecretName "") -}}
startupProbe:
  httpGet: {path: /readyz, port: metrics, scheme: {{ $scheme }}}
  periodSeconds: 1
  failureThreshold: 60
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
{{- if .Values.metricsAuth.basicAuthSecretName }}
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
{{- if .Values.metricsAuth.basicAuthSecretName }}
- name: outrider-basic-auth
  secret:
    secretName: {{ .Values.metricsAuth.basicAuthSecretName }}
    items: [{key: username, path: username}, {key: password, path: password}]
{{- end }}
{{- end -}}

{{/* TLS and basic auth of a ServiceMonitor or PodMonitor endpoint, when metricsAuth is on: Prometheus checks the
     agent's certificate against the CA from a Secret (never insecureSkipVerify) and sends the credentials from a
     Secret (in the monitor's namespace). */}}
{{- define "outrider.monitorAuth" -}}
{{- with .Values.metricsAuth }}
{{- if .tlsSecretName }}
scheme: https
tlsConfig:
  ca:
    secret: {name: {{ default .tlsSecretName .caSecretName | quote }}, key: ca.crt}
  serverName: {{ default (printf "%s.%s.svc" (include "outrider.fullname" $) $.Release.Namespace) .serverName | quote }}
{{- end }}
{{- if .basicAuthSecretName }}
basicAuth:
  username: {name: {{ .basicAuthSecretName | quote }}, key: username}
  password: {name: {{ .basicAuthSecretName | quote }}, key: password}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The sidecar for users' workloads. In a pod template (of this chart, or of a chart that depends on it; see
outrider.resolveScope for what `.` may be):
  metadata:
    labels:
      {{- include "outrider.sidecarPodLabels" . | nindent 6 }}
      outrider.dev/job: my-training          # the `job` label of the scraped series (podMonitor.jobLabel)
    annotations:
      {{- include "outrider.sidecarPodAnnotations" . | nindent 6 }}  # rolls a Deployment's pods; never in a Job
      outrider.dev/metrics-port: "8000"      # optional: the workload's own /metrics, scraped by the sidecar
  spec:
    shareProcessNamespace: true
    initContainers:                          # sidecar.native (Kubernetes >= 1.29); else under containers, after
      {{- include "outrider.sidecar" . | nindent 6 }}  # the workload's (the kubelet starts them in order)
    containers:
      - name: trainer
        env:
          {{- include "outrider.workloadEnv" . | nindent 10 }}
        volumeMounts:
          {{- include "outrider.workloadVolumeMounts" . | nindent 10 }}
    volumes:
      {{- include "outrider.sidecarVolumes" . | nindent 6 }}
*/}}
{{- define "outrider.sidecar" -}}
{{- $r := dict -}}
{{- include "outrider.resolveScope" (dict "in" . "out" $r) -}}
{{- include "outrider.sidecarContainer" $r.scope -}}
{{- end -}}

{{- define "outrider.sidecarContainer" -}}
{{- if and .Values.sidecar.native (not (semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version)) }}
{{- /* Older API servers drop restartPolicy from an init container, which then never ends: the pod would hang. */}}
{{- fail (printf "sidecar.native needs Kubernetes >= 1.29 (native sidecars), this cluster is %s: set sidecar.native=false" .Capabilities.KubeVersion.Version) }}
{{- end }}
- name: outrider
  image: {{ include "outrider.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.sidecar.native }}
  {{- /* A native sidecar: started before the workload, stopped (SIGTERM: final sweep and flush) after it, and
         no reason for a Job to stay Running. */}}
  restartPolicy: Always
  {{- end }}
  args: {{ concat (list "agent") .Values.sidecar.extraArgs | toJson }}
  env:
    {{- include "outrider.env" . | nindent 4 }}
    - name: OUTRIDER_SPOOL_DIR
      value: {{ .Values.sidecar.spoolDir | quote }}
    {{- /* The pod's annotations: outrider.dev/metrics-port (and -path) name the workload's own /metrics. */}}
    - name: OUTRIDER_POD_ANNOTATIONS_FILE
      value: /etc/outrider/podinfo/annotations
    {{- if not .Values.sidecar.native }}
    {{- /* An ordinary container would keep a Job's pod Running after the workload: the agent leaves with it. Listed
           after the workload's containers, it starts once they have (the kubelet starts a pod's containers in
           order): none of their processes there means they have exited already, so it waits for them briefly. */}}
    - name: OUTRIDER_EXIT_WHEN_WORKLOAD_EXITS
      value: "true"
    - name: OUTRIDER_STARTUP_GRACE_S
      value: {{ .Values.sidecar.startupGraceSeconds | quote }}
    {{- end }}
    {{- with .Values.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - {name: metrics, containerPort: {{ .Values.port }}, protocol: TCP}
  {{- include "outrider.probes" . | nindent 2 }}
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  securityContext:
    {{- include "outrider.containerSecurityContext" (dict "uid" 65532) | nindent 4 }}
  volumeMounts:
    {{- include "outrider.volumeMounts" . | nindent 4 }}
    - name: outrider-spool
      mountPath: {{ .Values.sidecar.spoolDir }}
    - name: outrider-podinfo
      mountPath: /etc/outrider/podinfo
      readOnly: true
    {{- with .Values.sidecar.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{- define "outrider.sidecarVolumes" -}}
{{- $r := dict -}}
{{- include "outrider.resolveScope" (dict "in" . "out" $r) -}}
{{- with $r.scope -}}
{{ include "outrider.volumes" . }}
- name: outrider-spool
  emptyDir: {sizeLimit: 64Mi}
- name: outrider-podinfo
  downwardAPI:
    items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]
{{- with .Values.sidecar.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The workload container's side: the spool it publishes to, and no in-process agent of its own (the sidecar is
     the agent; without this, a workload that starts first would serve /metrics itself). */}}
{{- define "outrider.workloadEnv" -}}
{{- $r := dict -}}
{{- include "outrider.resolveScope" (dict "in" . "out" $r) -}}
- {name: OUTRIDER_SPOOL_DIR, value: {{ $r.scope.Values.sidecar.spoolDir | quote }}}
- {name: OUTRIDER_STANDALONE, value: "false"}
{{- end -}}

{{- define "outrider.workloadVolumeMounts" -}}
{{- $r := dict -}}
{{- include "outrider.resolveScope" (dict "in" . "out" $r) -}}
- {name: outrider-spool, mountPath: {{ $r.scope.Values.sidecar.spoolDir | quote }}}
{{- end -}}

{{- define "outrider.sidecarPodLabels" -}}
outrider.dev/sidecar: "true"
{{- end -}}

{{/* checksum/config, which rolls the pods of a Deployment (StatefulSet, DaemonSet) when the agent's configuration
     changes. Not for a Job: its pod template is immutable, and `helm upgrade` would fail on the changed checksum. */}}
{{- define "outrider.sidecarPodAnnotations" -}}
{{- $r := dict -}}
{{- include "outrider.resolveScope" (dict "in" . "out" $r) -}}
checksum/config: {{ include "outrider.configChecksum" $r.scope }}
{{- end -}}
