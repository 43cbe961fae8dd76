{{/* Names. Kubernetes names are DNS labels: at most 63 characters. */}}
{{- define "saar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "saar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "saar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A model key as a name fragment: "Qwen/Qwen3-8B" -> "qwen-qwen3-8b". */}}
{{- define "saar.slug" -}}
{{- regexReplaceAll "[^a-z0-9-]+" (lower .) "-" | trimAll "-" -}}
{{- end -}}

{{- define "saar.routerName" -}}
{{- printf "%s-router" (include "saar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* (dict "root" $ "model" $name) */}}
{{- define "saar.eppName" -}}
{{- printf "%s-epp-%s" (include "saar.fullname" .root) (include "saar.slug" .model) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* (dict "root" $ "model" $name "spec" $spec): the InferencePool's name. */}}
{{- define "saar.poolName" -}}
{{- $pool := .spec.pool | default dict -}}
{{- if $pool.name -}}
{{- $pool.name -}}
{{- else -}}
{{- printf "%s-%s" (include "saar.fullname" .root) (include "saar.slug" .model) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "saar.redisName" -}}
{{- printf "%s-redis" (include "saar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "saar.adminSecretName" -}}
{{- .Values.admin.existingSecret | default (printf "%s-admin" (include "saar.fullname" .)) -}}
{{- end -}}

{{- define "saar.identitySecretName" -}}
{{- .Values.identity.existingSecret | default (printf "%s-identity" (include "saar.fullname" .)) -}}
{{- end -}}

{{/* The gRPC certificate's Secret: yours, the provisioned one, or none (each pod then makes
a self-signed one at start). */}}
{{- define "saar.tlsSecretName" -}}
{{- if .Values.server.tls.enabled -}}
{{- if .Values.server.tls.existingSecret -}}
{{- .Values.server.tls.existingSecret -}}
{{- else if .Values.provision.enabled -}}
{{- printf "%s-grpc-tls" (include "saar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the gRPC port asks callers for a client certificate (server.tls.clientCA). */}}
{{- define "saar.clientCA" -}}
{{- $ca := .Values.server.tls.clientCA | default dict -}}
{{- if and .Values.server.tls.enabled (or $ca.existingConfigMap $ca.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The ConfigMap and the Secret holding the provisioned certificate's CA (ca.crt). */}}
{{- define "saar.caName" -}}
{{- printf "%s-grpc-ca" (include "saar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The names a gateway reaches the router by. */}}
{{- define "saar.routerDnsNames" -}}
{{- $name := include "saar.routerName" . -}}
{{- $ns := .Release.Namespace -}}
{{- toJson (list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.%s" $name $ns .Values.provision.clusterDomain)) -}}
{{- end -}}

{{/* What the provision Job makes (JSON: {"args": [...], "secrets": [...], "configMaps": [...]}),
empty lists when you give everything yourself. */}}
{{- define "saar.provisionPlan" -}}
{{- $args := list -}}
{{- $secrets := list -}}
{{- $configMaps := list -}}
{{- if and (not .Values.admin.existingSecret) (not .Values.admin.token) -}}
{{- $name := include "saar.adminSecretName" . -}}
{{- $args = concat $args (list "--random" (printf "%s/%s" $name .Values.admin.existingSecretKey)) -}}
{{- $secrets = append $secrets $name -}}
{{- end -}}
{{- if and (not .Values.identity.existingSecret) (not .Values.identity.tenantSecret) -}}
{{- $name := include "saar.identitySecretName" . -}}
{{- $args = concat $args (list "--random" (printf "%s/%s" $name .Values.identity.existingSecretKey)) -}}
{{- $secrets = append $secrets $name -}}
{{- end -}}
{{- if and .Values.server.tls.enabled (not .Values.server.tls.existingSecret) -}}
{{- $tls := include "saar.tlsSecretName" . -}}
{{- $ca := include "saar.caName" . -}}
{{- $args = concat $args (list "--tls-secret" $tls "--ca" $ca "--days" (toString (int .Values.provision.certificateDays))) -}}
{{- range $dns := include "saar.routerDnsNames" . | fromJsonArray -}}
{{- $args = concat $args (list "--dns-name" $dns) -}}
{{- end -}}
{{- $secrets = concat $secrets (list $tls $ca) -}}
{{- $configMaps = append $configMaps $ca -}}
{{- end -}}
{{- toJson (dict "args" $args "secrets" $secrets "configMaps" $configMaps) -}}
{{- end -}}

{{- define "saar.routerServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ include "saar.routerName" . }}{{- else -}}default{{- end -}}
{{- end -}}

{{- define "saar.eppServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-epp" (include "saar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}default{{- end -}}
{{- end -}}

{{- define "saar.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Labels. (dict "root" $ "component" "router"|"endpoint-picker"|"redis" "pool" name?) */}}
{{- define "saar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "saar.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
saar-extproc/pool: {{ . }}
{{- end }}
{{- end -}}

{{- define "saar.labels" -}}
{{ include "saar.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: saar-extproc
helm.sh/chart: {{ include "saar.chart" .root }}
{{- end -}}

{{/* The shared-state section of the service config. */}}
{{- define "saar.redisUrl" -}}
{{- if .Values.redis.url -}}
{{- .Values.redis.url -}}
{{- else if .Values.redis.enabled -}}
{{- printf "redis://%s:%d/0" (include "saar.redisName" .) (int .Values.redis.port) -}}
{{- end -}}
{{- end -}}

{{- define "saar.state" -}}
{{- $url := include "saar.redisUrl" . -}}
{{- if $url }}
store: redis
redis_url: {{ $url | quote }}
timeout_ms: {{ int .Values.redis.timeoutMs }}
{{- else }}
store: memory
{{- end }}
{{- end -}}

{{/* The part of the service config that both roles share and the chart owns (YAML). */}}
{{- define "saar.ownedConfig" -}}
server:
  host: 0.0.0.0
  http_host: {{ .Values.server.httpHost | quote }}
  grpc_port: {{ int .Values.server.grpcPort }}
  http_port: {{ int .Values.server.httpPort }}
  health_port: {{ int .Values.server.healthPort }}
  drain:
    notice_seconds: {{ .Values.server.drain.noticeSeconds }}
    timeout_seconds: {{ .Values.server.drain.timeoutSeconds }}
  tls:
    enabled: {{ .Values.server.tls.enabled }}
    {{- if include "saar.tlsSecretName" . }}
    cert_file: /var/run/saar/tls/tls.crt
    key_file: /var/run/saar/tls/tls.key
    {{- else }}
    cert_file: null
    key_file: null
    {{- end }}
    {{- if include "saar.clientCA" . }}
    client_ca_file: /var/run/saar/client-ca/ca.crt
    {{- end }}
logging:
  level: {{ .Values.logging.level | quote }}
  format: {{ .Values.logging.format | quote }}
state:
  {{- include "saar.state" . | nindent 2 }}
admin:
  token_file: /var/run/saar/admin/token
identity:
  tenant_secret_file: /var/run/saar/identity/secret
models:
  {{- range $spec := .Values.models }}
  {{- $name := $spec.name }}
  {{ $name | quote }}:
    {{- $entry := dict "cluster" $name }}
    {{- range $key := list "pricing" "quality" "context_window" }}
    {{- if hasKey $spec $key }}{{ $_ := set $entry $key (index $spec $key) }}{{ end }}
    {{- end }}
    {{- $entry = merge $entry (deepCopy ($spec.config | default dict)) }}
    {{- toYaml $entry | nindent 4 }}
  {{- end }}
routing:
  model_header: {{ .Values.routing.modelHeader | quote }}
  logical_models: {{ toJson .Values.routing.logicalModels }}
  decisions:
    {{- toYaml .Values.routing.decisions | nindent 4 }}
{{- end -}}

{{/* The router's config, rendered: owned keys win over router.config, then config. */}}
{{- define "saar.routerConfig" -}}
{{- $owned := include "saar.ownedConfig" . | fromYaml -}}
{{- $_ := set $owned "scheduling" (dict "enabled" false) -}}
{{- toYaml (merge $owned (deepCopy .Values.router.config) (deepCopy .Values.config)) -}}
{{- end -}}

{{/* (dict "root" $ "model" $name "spec" $spec): that model's picker's config, rendered. */}}
{{- define "saar.eppConfig" -}}
{{- $root := .root -}}
{{- $owned := include "saar.ownedConfig" $root | fromYaml -}}
{{- $discovery := dict "mode" "kubernetes" "namespace" $root.Release.Namespace "inference_pool" (include "saar.poolName" .) "role_label" $root.Values.inferencePool.roleLabel -}}
{{- $scheduling := merge (dict "discovery" $discovery) (deepCopy $root.Values.epp.scheduling) -}}
{{- $_ := set $owned "scheduling" $scheduling -}}
{{- if not (include "saar.pickersClientCA" $root) -}}
{{- $_ := unset $owned.server.tls "client_ca_file" -}}
{{- end -}}
{{- toYaml (merge $owned (deepCopy $root.Values.epp.config) (deepCopy $root.Values.config)) -}}
{{- end -}}

{{/* Whether the endpoint pickers ask for client certificates too (clientCA.pickers). */}}
{{- define "saar.pickersClientCA" -}}
{{- if and (include "saar.clientCA" .) .Values.server.tls.clientCA.pickers -}}true{{- end -}}
{{- end -}}

{{/* "grpc" or "http": how kubelet probes the pods (gRPC: on the plaintext health port). */}}
{{- define "saar.probeType" -}}
{{- ternary "http" "grpc" (eq .Values.probes.type "http") -}}
{{- end -}}

{{- define "saar.probe" -}}
{{- $root := .root -}}
{{- if eq (include "saar.probeType" $root) "grpc" }}
grpc:
  port: {{ int $root.Values.server.healthPort }}
  service: {{ .service }}
{{- else }}
httpGet:
  path: {{ .path }}
  port: http
{{- end }}
{{- toYaml .timing | nindent 0 }}
{{- end -}}

{{/* topologySpreadConstraints for pods with these selector labels. */}}
{{- define "saar.topologySpread" -}}
{{- $root := .root -}}
{{- if $root.Values.topologySpread.constraints }}
{{- toYaml $root.Values.topologySpread.constraints }}
{{- else }}
{{- range $key := list "topology.kubernetes.io/zone" "kubernetes.io/hostname" }}
- topologyKey: {{ $key }}
  maxSkew: {{ int $root.Values.topologySpread.maxSkew }}
  whenUnsatisfiable: {{ $root.Values.topologySpread.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- $.selector | nindent 6 }}
  matchLabelKeys: [pod-template-hash]
{{- end }}
{{- end }}
{{- end -}}

{{/*
The pod template of both roles.
(dict "root" $ "component" ... "pool" ... "args" list "configMap" name "checksum" sha
      "serviceAccount" name "resources" map "podAnnotations" map "podLabels" map)
*/}}
{{- define "saar.podTemplate" -}}
{{- $root := .root -}}
{{- $selector := include "saar.selectorLabels" (dict "root" $root "component" .component "pool" .pool) -}}
metadata:
  labels:
    {{- include "saar.labels" (dict "root" $root "component" .component "pool" .pool) | nindent 4 }}
    {{- with .podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ .checksum }}
    {{- if $root.Values.metrics.podAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $root.Values.server.httpPort | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with .podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ .serviceAccount }}
  automountServiceAccountToken: {{ .automountToken }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ int $root.Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- if $root.Values.topologySpread.enabled }}
  topologySpreadConstraints:
    {{- include "saar.topologySpread" (dict "root" $root "selector" $selector) | trim | nindent 4 }}
  {{- end }}
  {{- with $root.Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: saar
      image: {{ include "saar.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: [saar]
      args:
        {{- toYaml .args | nindent 8 }}
      ports:
        - name: grpc
          containerPort: {{ int $root.Values.server.grpcPort }}
          protocol: TCP
        - name: http
          containerPort: {{ int $root.Values.server.httpPort }}
          protocol: TCP
        - name: health
          containerPort: {{ int $root.Values.server.healthPort }}
          protocol: TCP
      env:
        - {name: PYTHONUNBUFFERED, value: "1"}
        - {name: PYTHONDONTWRITEBYTECODE, value: "1"}
        - {name: HOME, value: /tmp}
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - name: POD_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        {{- with $root.Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      startupProbe:
        {{- include "saar.probe" (dict "root" $root "service" "liveness" "path" $root.Values.probes.http.livenessPath "timing" $root.Values.probes.startup) | trim | nindent 8 }}
      livenessProbe:
        {{- include "saar.probe" (dict "root" $root "service" "liveness" "path" $root.Values.probes.http.livenessPath "timing" $root.Values.probes.liveness) | trim | nindent 8 }}
      readinessProbe:
        {{- include "saar.probe" (dict "root" $root "service" "readiness" "path" $root.Values.probes.http.readinessPath "timing" $root.Values.probes.readiness) | trim | nindent 8 }}
      {{- if gt (int $root.Values.preStopSleepSeconds) 0 }}
      lifecycle:
        preStop:
          sleep: {seconds: {{ int $root.Values.preStopSleepSeconds }}}
      {{- end }}
      resources:
        {{- toYaml .resources | nindent 8 }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      volumeMounts:
        - {name: config, mountPath: /etc/saar, readOnly: true}
        - {name: admin, mountPath: /var/run/saar/admin, readOnly: true}
        - {name: identity, mountPath: /var/run/saar/identity, readOnly: true}
        {{- if include "saar.tlsSecretName" $root }}
        - {name: tls, mountPath: /var/run/saar/tls, readOnly: true}
        {{- end }}
        {{- if .clientCA }}
        - {name: client-ca, mountPath: /var/run/saar/client-ca, readOnly: true}
        {{- end }}
        - {name: tmp, mountPath: /tmp}
  volumes:
    - name: config
      configMap:
        name: {{ .configMap }}
        items: [{key: config.yaml, path: config.yaml}]
    - name: admin
      secret:
        secretName: {{ include "saar.adminSecretName" $root }}
        defaultMode: 0440
        items: [{key: {{ $root.Values.admin.existingSecretKey | quote }}, path: token}]
    - name: identity
      secret:
        secretName: {{ include "saar.identitySecretName" $root }}
        defaultMode: 0440
        items: [{key: {{ $root.Values.identity.existingSecretKey | quote }}, path: secret}]
    {{- with include "saar.tlsSecretName" $root }}
    - name: tls
      secret:
        secretName: {{ . }}
        defaultMode: 0440
        items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]
    {{- end }}
    {{- if .clientCA }}
    {{- $ca := $root.Values.server.tls.clientCA }}
    - name: client-ca
      {{- if $ca.existingConfigMap }}
      configMap:
        name: {{ $ca.existingConfigMap }}
      {{- else }}
      secret:
        secretName: {{ $ca.existingSecret }}
        defaultMode: 0440
      {{- end }}
        items: [{key: {{ $ca.key | quote }}, path: ca.crt}]
    {{- end }}
    - name: tmp
      emptyDir: {sizeLimit: 256Mi}
{{- end -}}
