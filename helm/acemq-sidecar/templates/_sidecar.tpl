{{/*
The templates an application chart includes to run the sidecar in its own pods. Each
takes the scope described in _helpers.tpl; from an application chart that depends on this
one (docs/kubernetes.md has the whole example):

    {{- $acemq := dict "Values" (index .Values "acemq-sidecar") "Release" .Release }}
    spec:
      template:
        metadata:
          labels:
            {{- include "acemq-sidecar.podLabels" $acemq | nindent 12 }}
          annotations:
            {{- include "acemq-sidecar.podAnnotations" $acemq | nindent 12 }}
        spec:
          terminationGracePeriodSeconds: {{ include "acemq-sidecar.terminationGracePeriodSeconds" $acemq }}
          {{- with include "acemq-sidecar.initContainer" $acemq }}
          initContainers:
            {{- . | nindent 12 }}
          {{- end }}
          containers:
            - name: app
              ...
            {{- include "acemq-sidecar.container" $acemq | nindent 12 }}
          volumes:
            {{- include "acemq-sidecar.volumes" $acemq | nindent 12 }}

sidecar.native picks which of acemq-sidecar.container (classic) and
acemq-sidecar.initContainer (native) renders; the other renders nothing, so a chart that
includes both switches shape with one value. This chart (the dependency) still renders the
route map's ConfigMap, which the volume refers to; set deployment.enabled=false for it so
it adds no Deployment of its own.
*/}}

{{/* The classic sidecar, one item of a pod's containers; nothing when sidecar.native. */}}
{{- define "acemq-sidecar.container" -}}
{{- if not .Values.sidecar.native }}
{{- include "acemq-sidecar.containerItem" (dict "scope" . "shape" "classic") }}
{{- end }}
{{- end }}

{{/*
The native sidecar (KEP-753, Kubernetes >= 1.29), one item of a pod's initContainers;
nothing unless sidecar.native. restartPolicy: Always makes it a sidecar: it starts before
the application's containers (once its startup probe passes), runs beside them, and is
stopped after they have exited, so it relays what they publish until the end, and a Job
completes when its own containers do.
*/}}
{{- define "acemq-sidecar.initContainer" -}}
{{- if .Values.sidecar.native }}
{{- include "acemq-sidecar.containerItem" (dict "scope" . "shape" "native") }}
{{- end }}
{{- end }}

{{/*
The container. "shape": standalone (this chart's Deployment), classic (an application's
containers) or native (an application's initContainers).
*/}}
{{- define "acemq-sidecar.containerItem" -}}
{{- $shape := .shape }}
{{- with .scope }}
{{- $readiness := .Values.readinessProbe.enabled }}
{{- if kindIs "invalid" $readiness }}
{{- $readiness = eq $shape "standalone" }}
{{- end }}
- name: acemq-sidecar
  image: {{ include "acemq-sidecar.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if eq $shape "native" }}
  # A sidecar container: restarted whenever it exits, stopped after the app's containers.
  restartPolicy: Always
  {{- end }}
  # The image's entrypoint is `acemq-sidecar run`; these are its arguments.
  args:
    - --config
    - {{ include "acemq-sidecar.configDir" . }}/routes.yaml
    - --log-level
    - {{ .Values.logLevel | quote }}
  {{- with include "acemq-sidecar.env" (dict "scope" . "shape" $shape) | trim }}
  env:
    {{- . | nindent 4 }}
  {{- end }}
  {{- with .Values.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: {{ .Values.portName }}
      containerPort: {{ include "acemq-sidecar.port" . }}
      protocol: TCP
  {{- if or (eq $shape "native") .Values.startupProbe.enabled }}
  # /healthz until it first answers: the route map is read and HTTP is served. It does
  # not wait for the broker, so an outage never holds the application's start back.
  startupProbe:
    httpGet:
      path: /healthz
      port: {{ .Values.portName }}
    {{- toYaml (omit .Values.startupProbe "enabled") | nindent 4 }}
  {{- end }}
  {{- if .Values.livenessProbe.enabled }}
  # /healthz: the event loop is running.
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ .Values.portName }}
    {{- toYaml (omit .Values.livenessProbe "enabled") | nindent 4 }}
  {{- end }}
  {{- if $readiness }}
  # /readyz: connected, and every route consuming.
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ .Values.portName }}
    {{- toYaml (omit .Values.readinessProbe "enabled") | nindent 4 }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "acemq-sidecar.securityContext" (dict "scope" . "context" .Values.securityContext) | nindent 4 }}
  volumeMounts:
    # The directory, not a subPath: a changed ConfigMap reaches the file, and the
    # sidecar reloads it (it also rolls the pods, see acemq-sidecar.podAnnotations).
    - name: acemq-sidecar-config
      mountPath: {{ include "acemq-sidecar.configDir" . }}
      readOnly: true
    {{- if or (include "acemq-sidecar.tlsClientSecret" .) (include "acemq-sidecar.tlsCaSecret" .) }}
    # Read at every connect: a renewed certificate is used from the next reconnect on.
    - name: acemq-sidecar-tls
      mountPath: {{ include "acemq-sidecar.tlsDir" . }}
      readOnly: true
    {{- end }}
    {{- if eq (include "acemq-sidecar.brokerSecret" .) "credentials" }}
    # The login of broker.credentialsSecret, read at start and at each reload.
    - name: acemq-sidecar-broker
      mountPath: {{ include "acemq-sidecar.brokerDir" . }}
      readOnly: true
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
{{- end }}

{{/* The sidecar's volumes, as items of a pod's volumes list. */}}
{{- define "acemq-sidecar.volumes" -}}
- name: acemq-sidecar-config
  configMap:
    name: {{ include "acemq-sidecar.configMapName" . }}
{{- $client := include "acemq-sidecar.tlsClientSecret" . }}
{{- $ca := include "acemq-sidecar.tlsCaSecret" . }}
{{- if or $client $ca }}
# Only the listed keys, under fixed names: a key missing from its Secret stops the pod
# at ContainerCreating with an event naming the key.
- name: acemq-sidecar-tls
  projected:
    # Readable by the sidecar's user whatever the pod's fsGroup; only this container
    # mounts the volume.
    defaultMode: 0444
    sources:
      {{- if $client }}
      - secret:
          name: {{ $client }}
          items:
            - {key: {{ .Values.tls.certKey | quote }}, path: tls.crt}
            - {key: {{ .Values.tls.keyKey | quote }}, path: tls.key}
      {{- end }}
      {{- if $ca }}
      - secret:
          name: {{ $ca }}
          items:
            - {key: {{ .Values.tls.caKey | quote }}, path: ca.crt}
      {{- end }}
{{- end }}
{{- if eq (include "acemq-sidecar.brokerSecret" .) "credentials" }}
{{- $credentials := .Values.broker.credentialsSecret }}
# The login only, under fixed names (host and port come as variables).
- name: acemq-sidecar-broker
  projected:
    defaultMode: 0444
    sources:
      - secret:
          name: {{ $credentials.name }}
          items:
            - {key: {{ $credentials.usernameKey | quote }}, path: username}
            - {key: {{ $credentials.passwordKey | quote }}, path: password}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Pod labels: the label the metrics Service (with deployment.enabled=false) and the
PodMonitor select the sidecar's pods by. Add it to your pod template's labels, not to the
Deployment's selector.
*/}}
{{- define "acemq-sidecar.podLabels" -}}
{{ include "acemq-sidecar.instanceLabel" . }}
{{- end }}

{{/*
Pod annotations. A changed route map changes the pod template, so the pods roll; so does a
rotated broker Secret: its resourceVersion as `helm upgrade` reads it from the cluster, or
broker.urlSecret.revision (for renders that cannot read the cluster). Hashed, so nothing
of the Secret is shown.
*/}}
{{- define "acemq-sidecar.podAnnotations" -}}
{{- $secret := .Values.broker.urlSecret }}
{{- $keys := $secret.key }}
{{- if eq (include "acemq-sidecar.brokerSecret" .) "credentials" }}
{{- $secret = .Values.broker.credentialsSecret }}
{{- $address := include "acemq-sidecar.brokerAddress" . | fromYaml }}
{{- $keys = printf "%s,%s,%s" $secret.usernameKey $secret.passwordKey (toJson $address) }}
{{- end }}
{{- $revision := $secret.revision }}
{{- if not $revision }}
{{- $live := lookup "v1" "Secret" .Release.Namespace $secret.name }}
{{- $revision = dig "metadata" "resourceVersion" "" ($live | default dict) }}
{{- end }}
checksum/acemq-sidecar-config: {{ include "acemq-sidecar.routeMap" . | sha256sum }}
checksum/acemq-broker-secret: {{ printf "%s/%s/%s" $secret.name $keys $revision | sha256sum }}
{{- end }}

{{/* The sidecar container's environment, items of env (none at all is possible). */}}
{{- define "acemq-sidecar.env" -}}
{{- $shape := .shape }}
{{- with .scope }}
{{- if eq (include "acemq-sidecar.brokerSecret" .) "url" }}
# The route map's broker.url is "${AMQP_URL}": the URL stays in the Secret.
- name: AMQP_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.broker.urlSecret.name }}
      key: {{ .Values.broker.urlSecret.key }}
{{- else }}
{{- $address := include "acemq-sidecar.brokerAddress" . | fromYaml }}
{{- if $address.secret }}
# The route map's broker.url is built of these two; the login is read from files.
- name: ACEMQ_BROKER_HOST
  valueFrom:
    secretKeyRef:
      name: {{ $address.secret }}
      key: {{ $address.hostKey }}
- name: ACEMQ_BROKER_PORT
  valueFrom:
    secretKeyRef:
      name: {{ $address.secret }}
      key: {{ $address.portKey }}
{{- end }}
{{- if and .Values.keda.enabled (eq $shape "standalone") (not .Values.keda.authenticationRef.name) }}
# KEDA's rabbitmq trigger reads the broker's address here (no login in it).
- name: ACEMQ_BROKER_ADDRESS
  value: {{ include "acemq-sidecar.kedaAddress" . | quote }}
{{- end }}
{{- end }}
{{- if and .Values.keda.enabled .Values.tls.enabled (eq $shape "standalone") (not .Values.keda.authenticationRef.name) }}
# KEDA's rabbitmq trigger takes its tls switch from here (TriggerAuthentication.env).
- name: ACEMQ_KEDA_TLS
  value: enable
{{- end }}
{{- include "acemq-sidecar.tracingEnv" . }}
{{- with .Values.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
{{- end }}

{{/* Tracing's standard OTEL_* variables (values tracing), items of env; none when off. */}}
{{- define "acemq-sidecar.tracingEnv" -}}
{{- with .Values.tracing }}
{{- if .enabled }}
{{- if not .endpoint }}
{{- fail "tracing.enabled needs tracing.endpoint: the OTLP collector's base URL, e.g. http://otel-collector.observability:4318" }}
{{- end }}
# Tracing: spans exported by OTLP (docs/observability.md, "Tracing").
- name: OTEL_TRACES_EXPORTER
  value: otlp
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: parentbased_traceidratio
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerRatio | toString | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .serviceName | default (include "acemq-sidecar.fullname" $) | quote }}
{{- with .resourceAttributes }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ include "acemq-sidecar.resourceAttributes" . | quote }}
{{- end }}
{{- if .headersSecret.name }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .headersSecret.name }}
      key: {{ .headersSecret.key }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES of a map: key=value pairs, comma-separated, in key order. */}}
{{- define "acemq-sidecar.resourceAttributes" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key (toString $value)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
