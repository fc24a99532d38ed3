{{/*
Object names are those of manifests/ (schedext, schedext-scheduler, ...), so docs/deploy.md's
commands work on either install, and the Service keeps the name schedext's certificate is
issued for. One release per cluster: the ClusterRoles are cluster-wide.
*/}}

{{/* Labels of every object: the manifests' pair, plus Helm's own. */}}
{{- define "schedext.labels" -}}
app.kubernetes.io/name: {{ .name }}
{{ include "schedext.commonLabels" .root }}
{{- end }}

{{/* The labels of an object that names no component (the agent's Namespace). */}}
{{- define "schedext.commonLabels" -}}
app.kubernetes.io/part-of: schedext
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
The labels a selector matches (Deployments, the DaemonSet, Services, PodDisruptionBudgets,
anti-affinity, PodMonitors): the component's name and the release, so that nothing selects
the pods of another release or of a plain-manifests install. A Deployment's selector cannot
change in place: docs/deploy.md, "Upgrades", says what an upgrade from chart 0.1.0 needs.
*/}}
{{- define "schedext.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* Pod template labels: the selector's, and the user's. */}}
{{- define "schedext.podLabels" -}}
{{ include "schedext.selectorLabels" . }}
app.kubernetes.io/part-of: schedext
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "schedext.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "schedext.schedulerImage" -}}
{{ .Values.scheduler.image.repository }}:{{ .Values.scheduler.image.tag }}
{{- end }}

{{/* The Service's DNS name: schedext's certificate names it, kube-scheduler checks it. */}}
{{- define "schedext.serviceHost" -}}
schedext.{{ .Release.Namespace }}.svc
{{- end }}

{{/* The extender's httpTimeout in seconds: schedext's bind.extender_http_timeout_s. */}}
{{- define "schedext.httpTimeout" -}}
{{ dig "bind" "extender_http_timeout_s" 30 .Values.schedext.config }}
{{- end }}

{{/*
terminationGracePeriodSeconds of the pods that run schedext or kube-scheduler: longer than
the extender's httpTimeout, so in-flight binds finish before schedext exits (45 s for 30).
*/}}
{{- define "schedext.gracePeriod" -}}
{{ max 45 (add (include "schedext.httpTimeout" . | float64 | ceil) 15) }}
{{- end }}

{{/* Where the settings file is mounted in the schedext container. */}}
{{- define "schedext.configDir" -}}/etc/schedext/config{{- end }}

{{/* The Lease of schedext's leader election (its setting leader.lease_name). */}}
{{- define "schedext.leaseName" -}}
{{ dig "leader" "lease_name" "schedext" .Values.schedext.config }}
{{- end }}

{{/*
The Prometheus annotations of a pod that serves /metrics on `port`, plus the user's.
*/}}
{{- define "schedext.podAnnotations" -}}
{{- $annotations := dict }}
{{- if and .root.Values.metrics.prometheusAnnotations .port }}
{{- $_ := set $annotations "prometheus.io/scrape" "true" }}
{{- $_ := set $annotations "prometheus.io/port" (toString .port) }}
{{- if .path }}
{{- $_ := set $annotations "prometheus.io/path" .path }}
{{- end }}
{{- end }}
{{- $annotations = merge (deepCopy (.extra | default dict)) $annotations }}
{{- if $annotations }}
annotations:
  {{- toYaml $annotations | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Checksums of what the pods read from ConfigMaps at start, so that `helm upgrade` rolls them
when it changes.
*/}}
{{- define "schedext.checksums" -}}
{{- $root := .root }}
{{- $sums := dict "schedext.io/config-checksum" (toYaml $root.Values.schedext.config | sha256sum | trunc 16) }}
{{- if .scheduler }}
{{- $_ := set $sums "schedext.io/scheduler-config-checksum" (include (print $root.Template.BasePath "/scheduler-config.yaml") $root | sha256sum | trunc 16) }}
{{- end }}
{{- toYaml $sums }}
{{- end }}

{{/*
The kube-scheduler container, the same in both modes (the mounts of mTLS mode's client
certificate aside).
*/}}
{{- define "schedext.schedulerContainer" -}}
- name: kube-scheduler
  image: {{ include "schedext.schedulerImage" . }}
  imagePullPolicy: {{ .Values.scheduler.image.pullPolicy }}
  command:
    - kube-scheduler
    - --config=/etc/kubernetes/schedext-scheduler/scheduler-config.yaml
    - --v={{ .Values.scheduler.verbosity }}
  ports:
    # Secure port (self-signed in memory, nothing written to disk): probes, /metrics.
    - {name: probe-port, containerPort: 10259, protocol: TCP}
  # The kubeadm probes of kube-scheduler.
  startupProbe:
    httpGet: {path: /livez, port: probe-port, scheme: HTTPS}
    initialDelaySeconds: 10
    periodSeconds: 10
    timeoutSeconds: 15
    failureThreshold: 24
  livenessProbe:
    httpGet: {path: /livez, port: probe-port, scheme: HTTPS}
    initialDelaySeconds: 10
    periodSeconds: 10
    timeoutSeconds: 15
    failureThreshold: 8
  readinessProbe:
    # Ready once its informers synced; a standby waiting for the lease is ready too.
    httpGet: {path: /readyz, port: probe-port, scheme: HTTPS}
    periodSeconds: 5
    timeoutSeconds: 15
    failureThreshold: 3
  resources:
    {{- toYaml .Values.scheduler.resources | nindent 4 }}
  {{- include "schedext.containerSecurityContext" . | nindent 2 }}
  volumeMounts:
    - {name: config, mountPath: /etc/kubernetes/schedext-scheduler, readOnly: true}
    {{- if eq .Values.mode "mtls" }}
    - {name: client-tls, mountPath: /etc/schedext/client-tls, readOnly: true}
    {{- end }}
{{- end }}

{{/*
The schedext container's arguments beyond the transport: its settings file, the metrics
listener and the views listener.
*/}}
{{- define "schedext.commonArgs" -}}
- --config={{ include "schedext.configDir" . }}/schedext.yaml
{{- if .Values.metrics.port }}
# /metrics and /healthz only, plain HTTP on every address, for Prometheus.
- --metrics-port={{ .Values.metrics.port }}
{{- end }}
{{- if .Values.views.port }}
# The read-only views only, plain HTTP on every address, for the Service's `views` port
# (kubectl schedext).
- --views-port={{ .Values.views.port }}
{{- end }}
{{- end }}

{{/* The container ports of schedext's plain-HTTP listeners: metrics, views. */}}
{{- define "schedext.plainPorts" -}}
{{- if .Values.metrics.port }}
- {name: metrics, containerPort: {{ .Values.metrics.port }}, protocol: TCP}
{{- end }}
{{- if .Values.views.port }}
- {name: views, containerPort: {{ .Values.views.port }}, protocol: TCP}
{{- end }}
{{- end }}

{{/* The Service port `views`, which kubectl schedext names in its proxy URL. */}}
{{- define "schedext.viewsServicePort" -}}
- {name: views, port: {{ .Values.views.port }}, targetPort: views, protocol: TCP}
{{- end }}

{{/*
The labels of the Prometheus Operator's objects: the chart's, and monitoring.labels (the
chart's win where both name one).
*/}}
{{- define "schedext.monitoringLabels" -}}
{{- $labels := include "schedext.labels" (dict "name" .name "root" .root) | fromYaml }}
{{- toYaml (merge $labels (.root.Values.monitoring.labels | default dict)) }}
{{- end }}

{{- define "schedext.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* nodeSelector, tolerations and affinity of a pod spec, from one values group. */}}
{{- define "schedext.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/*
The pod securityContext of the schedext and scheduler pods: what the "restricted" Pod Security
Standard asks. fsGroup: the group that may read the private keys (mode 0440), mTLS mode.
*/}}
{{- define "schedext.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  {{- if eq .Values.mode "mtls" }}
  fsGroup: 65532
  {{- end }}
  seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "schedext.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{/*
Combinations the schema cannot express; each fails `helm template` and `helm install` with
a sentence saying why.
*/}}
{{- define "schedext.validate" -}}
{{- if and (eq .Values.mode "sidecar") (ne (int .Values.scheduler.replicas) 1) }}
{{- fail "scheduler.replicas must be 1 in sidecar mode: schedext keeps its reservations in memory and takes no lease of its own, so a second pod would duplicate its status writes (use mode=mtls for replicas)" }}
{{- end }}
{{- if and (eq .Values.mode "mtls") (gt (int .Values.schedext.replicas) 1) (not .Values.schedext.leaderElect) }}
{{- fail "schedext.replicas > 1 needs schedext.leaderElect: two inventories answering at once could hand out a GPU twice" }}
{{- end }}
{{- with .Values.views.port }}
{{- $verbs := ternary "8443" "8888" (eq $.Values.mode "mtls") }}
{{- $taken := dict $verbs (printf "the verbs' port %s" $verbs) }}
{{- if eq $.Values.mode "sidecar" }}
{{- $_ := set $taken "10259" "kube-scheduler's secure port 10259 in the same pod" }}
{{- end }}
{{- with $.Values.metrics.port }}
{{- $_ := set $taken (toString (int .)) "metrics.port" }}
{{- end }}
{{- with get $taken (toString (int .)) }}
{{- fail (printf "views.port must differ from %s: each listener of the pod needs a port of its own" .) }}
{{- end }}
{{- end }}
{{- if and .Values.monitoring.podMonitors (not .Values.metrics.port) }}
{{- fail "monitoring.podMonitors needs metrics.port: the PodMonitor schedext scrapes the container port named metrics, which exists only with it" }}
{{- end }}
{{- if and .Values.agent.enabled (eq .Values.agent.namespace .Release.Namespace) }}
{{- fail (printf "agent.namespace must differ from the release namespace %s: the agent needs root and a hostPath, which the \"restricted\" Pod Security Standard of the release namespace forbids" .Release.Namespace) }}
{{- end }}
{{- include "schedext.validateSettings" . }}
{{- end }}

{{/*
schedext's own rules between settings, which values.schema.json cannot express: a rendering
helm accepts is one schedext starts with (tests/e2e/test_chart.py runs `schedext config
--check` on each). The words are schedext's (app/service/settings.py), prefixed with
"schedext.config: "; the settings are merged over their defaults from files/settings.json,
which scripts/gen-chart-schema writes from the settings. The listener settings are the
chart's: it sets them from mode, metrics.port and views.port, as flags.
*/}}
{{- define "schedext.validateSettings" -}}
{{- $rules := .Files.Get "files/settings.json" | fromJson }}
{{- $given := .Values.schedext.config | default dict }}
{{- $cfg := mergeOverwrite (deepCopy $rules.defaults) (deepCopy $given) }}
{{- range $key := list "host" "port" "tls_cert_file" "tls_key_file" "tls_client_ca_file" "insecure_allow_remote" "metrics_port" "views_port" }}
{{- if hasKey (dig "server" dict $given) $key }}
{{- fail (printf "schedext.config: server.%s is the chart's to set (from mode, metrics.port and views.port, as flags): remove it" $key) }}
{{- end }}
{{- end }}
{{- $maxWait := float64 $cfg.gang.max_wait_s }}
{{- $api := float64 $cfg.bind.api_deadline_s }}
{{- $timeout := float64 $cfg.bind.extender_http_timeout_s }}
{{- $margin := float64 $rules.bindAnswerMarginS }}
{{- if gt (addf $maxWait $api $margin) $timeout }}
{{- fail (printf "schedext.config: gang.max_wait_s (%g) + bind.api_deadline_s (%g) + %gs to answer must not exceed bind.extender_http_timeout_s (%g), kube-scheduler's extender httpTimeout: kube-scheduler would give up on binds that still go through" $maxWait $api $margin $timeout) }}
{{- end }}
{{- if or $cfg.leader.enabled (and (eq .Values.mode "mtls") .Values.schedext.leaderElect) }}
{{- $renew := float64 $cfg.leader.renew_deadline_s }}
{{- $lease := float64 $cfg.leader.lease_duration_s }}
{{- if ge (addf $renew $api) $lease }}
{{- fail (printf "schedext.config: leader.renew_deadline_s (%g) + bind.api_deadline_s (%g) must stay below leader.lease_duration_s (%g)" $renew $api $lease) }}
{{- end }}
{{- if ge (float64 $cfg.leader.retry_period_s) $renew }}
{{- fail "schedext.config: leader.retry_period_s must be shorter than leader.renew_deadline_s" }}
{{- end }}
{{- end }}
{{- range .Values.schedext.env }}
{{- $name := .name | upper }}
{{- if and (hasPrefix "SCHEDEXT_" $name) (not (has $name $rules.variables)) }}
{{- $mapKey := false }}
{{- range $rules.variablePrefixes }}
{{- if hasPrefix . $name }}{{ $mapKey = true }}{{ end }}
{{- end }}
{{- if not $mapKey }}
{{- fail (printf "schedext.env: %s names no setting of schedext (docs/configuration.md lists the variables it reads)" .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.agent.env }}
{{- if and (hasPrefix "SCHEDEXT_AGENT_" (.name | upper)) (not (has (.name | upper) $rules.agentVariables)) }}
{{- fail (printf "agent.env: %s names no setting of schedext agent (docs/configuration.md lists the variables it reads)" .name) }}
{{- end }}
{{- end }}
{{- end }}
