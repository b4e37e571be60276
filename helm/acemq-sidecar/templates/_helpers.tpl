{{/*
Helpers. Every template below that an application chart may call takes a "scope": either
this chart's own root context, or a dict with the same two keys built by the caller:

    (dict "Values" (index .Values "acemq-sidecar") "Release" .Release)

so the helpers read only .Values (the sidecar's values) and .Release. Names use the
constant "acemq-sidecar", not .Chart.Name: called from an application chart, .Chart is
that chart, and the ConfigMap name the container mounts must be the one this chart
rendered.
*/}}

{{- define "acemq-sidecar.name" -}}
{{- default "acemq-sidecar" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "acemq-sidecar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "acemq-sidecar" .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label (root context only). */}}
{{- define "acemq-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object this chart renders (root context only), commonLabels last. */}}
{{- define "acemq-sidecar.labels" -}}
helm.sh/chart: {{ include "acemq-sidecar.chart" . }}
{{ include "acemq-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: acemq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
metadata.annotations of an object: commonAnnotations and the object's own (a dict, may be
empty), rendered under an "annotations:" key only when there is one. Call with
(dict "root" . "own" $annotations) at the indentation of the other metadata keys.
*/}}
{{- define "acemq-sidecar.annotations" -}}
{{- $all := merge (deepCopy (.own | default dict)) (.root.Values.commonAnnotations | default dict) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The label the sidecar's pods carry in every shape (acemq-sidecar.podLabels), so that the
metrics Service and the PodMonitor find them in an application's pods too.
*/}}
{{- define "acemq-sidecar.instanceLabel" -}}
acemq-sidecar/instance: {{ include "acemq-sidecar.fullname" . }}
{{- end }}

{{/*
The metrics Service's name: a DNS-1035 label of at most 63 characters, so the full name
is cut to leave room for the suffix.
*/}}
{{- define "acemq-sidecar.serviceName" -}}
{{- $name := printf "%s-metrics" (include "acemq-sidecar.fullname" . | trunc 55 | trimSuffix "-") }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) }}
{{- fail (printf "the metrics Service would be named %q, which is not a DNS-1035 label (a Service name starts with a letter and has no dots); set fullnameOverride" $name) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* The job label Prometheus gives the sidecar's series through this chart's monitors. */}}
{{- define "acemq-sidecar.jobs" -}}
{{- printf "%s|%s/%s" (include "acemq-sidecar.serviceName" .) .Release.Namespace (include "acemq-sidecar.fullname" .) }}
{{- end }}

{{/* The PromQL matchers every alert and dashboard query of this release uses. */}}
{{- define "acemq-sidecar.matchers" -}}
{{- .Values.prometheusRule.matchers | default (printf "namespace=%q, job=~%q" .Release.Namespace (include "acemq-sidecar.jobs" .)) }}
{{- end }}

{{/* The ServiceAccount of the standalone Deployment's pods. */}}
{{- define "acemq-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "acemq-sidecar.fullname" .) }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "acemq-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "acemq-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "acemq-sidecar.configMapName" -}}
{{- printf "%s-routes" (include "acemq-sidecar.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "acemq-sidecar.image" -}}
{{- $image := .Values.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository $image.tag }}
{{- end }}
{{- end }}

{{/*
The metrics port, from routeMap.http.listen ("host:port" or "[v6]:port"). The chart needs
a literal address: it is the port of the probes, the Service and the ServiceMonitor.
*/}}
{{- define "acemq-sidecar.port" -}}
{{- $listen := .Values.routeMap.http.listen | default "0.0.0.0:9090" }}
{{- if contains "$" $listen }}
{{- fail (printf "routeMap.http.listen: the chart needs a literal host:port (it is the probes' and the Service's port), got %q" $listen) }}
{{- end }}
{{- $port := regexFind "[0-9]+$" $listen }}
{{- $host := trimSuffix (printf ":%s" $port) $listen | trimPrefix "[" | trimSuffix "]" }}
{{- if or (not $port) (eq $host $listen) }}
{{- fail (printf "routeMap.http.listen: expected host:port, e.g. \"0.0.0.0:9090\", got %q" $listen) }}
{{- end }}
{{- if has $host (list "127.0.0.1" "localhost" "::1") }}
{{- fail (printf "routeMap.http.listen: %q listens on loopback only; the kubelet's probes and Prometheus connect to the pod IP: use \"0.0.0.0:%s\"" $listen $port) }}
{{- end }}
{{- $number := atoi $port }}
{{- if or (lt $number 1) (gt $number 65535) }}
{{- fail (printf "routeMap.http.listen: port %s is not a port from 1 to 65535" $port) }}
{{- end }}
{{- $number }}
{{- end }}

{{/*
The route map as the sidecar reads it: routeMap from the values, with broker.url set to
the environment variable AMQP_URL (from the Secret) and broker.tls to the mounted files.
*/}}
{{- define "acemq-sidecar.routeMap" -}}
{{- $routeMap := deepCopy .Values.routeMap }}
{{- if not $routeMap.routes }}
{{- fail "routeMap.routes: set at least one route (name, from, to); see values.yaml" }}
{{- end }}
{{- $broker := default dict $routeMap.broker }}
{{- $_ := set $broker "url" "${AMQP_URL}" }}
{{- if .Values.tls.enabled }}
{{- $tls := dict "ca_file" nil "cert_file" nil "key_file" nil }}
{{- $dir := include "acemq-sidecar.tlsDir" . }}
{{- if include "acemq-sidecar.tlsCaSecret" . }}
{{- $_ := set $tls "ca_file" (printf "%s/ca.crt" $dir) }}
{{- end }}
{{- if include "acemq-sidecar.tlsClientSecret" . }}
{{- $_ := set $tls "cert_file" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $tls "key_file" (printf "%s/tls.key" $dir) }}
{{- end }}
{{- $_ := set $broker "tls" $tls }}
{{- end }}
{{- $_ := set $routeMap "broker" $broker }}
{{- toYaml $routeMap }}
{{- end }}

{{- define "acemq-sidecar.configDir" -}}
/etc/acemq-sidecar
{{- end }}

{{/*
The Secret holding the client certificate, or "" for none. certKey and keyKey go together.
*/}}
{{- define "acemq-sidecar.tlsClientSecret" -}}
{{- $tls := .Values.tls }}
{{- if and $tls.enabled $tls.secretName }}
{{- if and $tls.certKey $tls.keyKey }}
{{- $tls.secretName }}
{{- else if or $tls.certKey $tls.keyKey }}
{{- fail "tls: certKey and keyKey go together; set both (a client certificate) or neither" }}
{{- else if not $tls.caKey }}
{{- fail (printf "tls.secretName %q: with certKey and keyKey empty it is only read for caKey; set caKey, or tls.secretName \"\"" $tls.secretName) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the CA bundle, or "" for the system trust store. */}}
{{- define "acemq-sidecar.tlsCaSecret" -}}
{{- $tls := .Values.tls }}
{{- if and $tls.enabled $tls.caKey }}
{{- $secret := $tls.caSecretName | default $tls.secretName }}
{{- if not $secret }}
{{- fail (printf "tls.caKey %q names a key, but of no Secret: set tls.caSecretName (or tls.secretName); leave caKey \"\" for the system trust store" $tls.caKey) }}
{{- end }}
{{- $secret }}
{{- end }}
{{- end }}

{{/* Not under configDir: a mount inside a ConfigMap volume's read-only directory fails. */}}
{{- define "acemq-sidecar.tlsDir" -}}
/etc/acemq-sidecar-tls
{{- end }}

{{/*
The sidecar's shutdown: shutdown_grace_s to settle in-flight messages, then up to
SHUTDOWN_SLACK_S (10 s, sidecar/service.py) to cancel consumers and close, plus a margin.
*/}}
{{- define "acemq-sidecar.minTerminationGracePeriodSeconds" -}}
{{- $grace := 30.0 }}
{{- if not (kindIs "invalid" .Values.routeMap.shutdown_grace_s) }}
{{- $grace = .Values.routeMap.shutdown_grace_s | float64 }}
{{- end }}
{{- add (ceil $grace | int) 10 5 }}
{{- end }}

{{- define "acemq-sidecar.terminationGracePeriodSeconds" -}}
{{- $minimum := include "acemq-sidecar.minTerminationGracePeriodSeconds" . | int }}
{{- $explicit := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $explicit }}
{{- $minimum }}
{{- else if lt (int $explicit) $minimum }}
{{- fail (printf "terminationGracePeriodSeconds: %d is too short for routeMap.shutdown_grace_s %v; the sidecar may need shutdown_grace_s + 10 s to close, so use at least %d (or null to derive it)" (int $explicit) .Values.routeMap.shutdown_grace_s $minimum) }}
{{- else }}
{{- int $explicit }}
{{- end }}
{{- end }}
