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

{{/* Labels of every object this chart renders (root context only). */}}
{{- define "acemq-sidecar.labels" -}}
helm.sh/chart: {{ include "acemq-sidecar.chart" . }}
{{ include "acemq-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: acemq
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
{{- if .Values.tls.caKey }}
{{- $_ := set $tls "ca_file" (printf "%s/%s" (include "acemq-sidecar.tlsDir" .) .Values.tls.caKey) }}
{{- end }}
{{- if and .Values.tls.certKey .Values.tls.keyKey }}
{{- $_ := set $tls "cert_file" (printf "%s/%s" (include "acemq-sidecar.tlsDir" .) .Values.tls.certKey) }}
{{- $_ := set $tls "key_file" (printf "%s/%s" (include "acemq-sidecar.tlsDir" .) .Values.tls.keyKey) }}
{{- else if or .Values.tls.certKey .Values.tls.keyKey }}
{{- fail "tls: certKey and keyKey go together; set both (a client certificate) or neither" }}
{{- end }}
{{- $_ := set $broker "tls" $tls }}
{{- end }}
{{- $_ := set $routeMap "broker" $broker }}
{{- toYaml $routeMap }}
{{- end }}

{{- define "acemq-sidecar.configDir" -}}
/etc/acemq-sidecar
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
