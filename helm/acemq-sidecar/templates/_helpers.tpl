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

{{/*
Labels of every object this chart renders (root context only): the chart's, then
commonLabels, then the object's own, each key once (a key given twice would be written
twice, which yaml.v3 and kustomize refuse). The selector labels (and "fixed", a dict of
the object's own selector labels) cannot be given another value: the selectors would
stop matching. Call with (dict "root" . "own" $labels "ownName" "podLabels" "fixed" $d).
*/}}
{{- define "acemq-sidecar.labelMap" -}}
{{- $root := .root }}
{{- $fixed := include "acemq-sidecar.selectorLabels" $root | fromYaml }}
{{- range $key, $value := (.fixed | default dict) }}
{{- $_ := set $fixed $key $value }}
{{- end }}
{{- $labels := dict "helm.sh/chart" (include "acemq-sidecar.chart" $root) "app.kubernetes.io/version" ($root.Chart.AppVersion | toString) "app.kubernetes.io/managed-by" $root.Release.Service "app.kubernetes.io/part-of" "acemq" }}
{{- $sources := list (list "commonLabels" ($root.Values.commonLabels | default dict)) (list (.ownName | default "labels") (.own | default dict)) }}
{{- range $source := $sources }}
{{- range $key, $value := index $source 1 }}
{{- if and (hasKey $fixed $key) (ne (toString $value) (toString (get $fixed $key))) }}
{{- fail (printf "%s: %q is a label the chart's selectors use (%q); leave it out, or give it that value" (index $source 0) $key (get $fixed $key)) }}
{{- end }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- end }}
{{- range $key, $value := $fixed }}
{{- $_ := set $labels $key $value }}
{{- end }}
{{- toYaml $labels }}
{{- end }}

{{- define "acemq-sidecar.labels" -}}
{{- include "acemq-sidecar.labelMap" (dict "root" .) }}
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
the environment variable AMQP_URL (from broker.urlSecret), or built from the variables
ACEMQ_BROKER_HOST and ACEMQ_BROKER_PORT with the login files of broker.credentialsSecret,
and broker.tls set to the mounted files.
*/}}
{{- define "acemq-sidecar.routeMap" -}}
{{- $routeMap := deepCopy .Values.routeMap }}
{{- if not $routeMap.routes }}
{{- fail "routeMap.routes: set at least one route (name, from, to); see values.yaml" }}
{{- end }}
{{- $broker := default dict $routeMap.broker }}
{{- $credentials := .Values.broker.credentialsSecret }}
{{- if eq (include "acemq-sidecar.brokerSecret" .) "credentials" }}
{{- $vhost := $credentials.vhost | urlquery | replace "+" "%20" }}
{{- $_ := set $broker "url" (printf "%s://${ACEMQ_BROKER_HOST}:${ACEMQ_BROKER_PORT}/%s" $credentials.scheme $vhost) }}
{{- $_ := set $broker "username_file" (printf "%s/username" (include "acemq-sidecar.brokerDir" .)) }}
{{- $_ := set $broker "password_file" (printf "%s/password" (include "acemq-sidecar.brokerDir" .)) }}
{{- else }}
{{- $_ := set $broker "url" "${AMQP_URL}" }}
{{- end }}
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
The sidecar's drain: shutdown_grace_s to settle in-flight messages, then up to
SHUTDOWN_SLACK_S (10 s, sidecar/service.py) to cancel consumers and close, plus a margin.
*/}}
{{- define "acemq-sidecar.minTerminationGracePeriodSeconds" -}}
{{- $grace := 30.0 }}
{{- if not (kindIs "invalid" .Values.routeMap.shutdown_grace_s) }}
{{- $grace = .Values.routeMap.shutdown_grace_s | float64 }}
{{- end }}
{{- add (ceil $grace | int) 10 5 }}
{{- end }}

{{/*
The pod's grace for a shape: standalone, the sidecar's drain; classic (every container
gets SIGTERM at once), the larger of it and the application's own; native (the kubelet
stops the sidecar only once the application's containers exited, from the one budget),
the two added. (dict "scope" . "shape" "standalone|classic|native")
*/}}
{{- define "acemq-sidecar.gracePeriod" -}}
{{- $values := .scope.Values }}
{{- $drain := include "acemq-sidecar.minTerminationGracePeriodSeconds" .scope | int }}
{{- $app := $values.sidecar.appTerminationGracePeriodSeconds | int }}
{{- $minimum := $drain }}
{{- $why := printf "the sidecar's drain is routeMap.shutdown_grace_s + 10 s + 5 s = %d" $drain }}
{{- if eq .shape "native" }}
{{- $minimum = add $app $drain }}
{{- $why = printf "a native sidecar is stopped after the application's containers, from the same budget: sidecar.appTerminationGracePeriodSeconds %d + the sidecar's drain %d = %d" $app $drain $minimum }}
{{- else if eq .shape "classic" }}
{{- $minimum = max $app $drain }}
{{- $why = printf "every container gets SIGTERM at once: the larger of sidecar.appTerminationGracePeriodSeconds %d and the sidecar's drain %d" $app $drain }}
{{- end }}
{{- $explicit := $values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $explicit }}
{{- $minimum }}
{{- else if lt (int $explicit) (int $minimum) }}
{{- fail (printf "terminationGracePeriodSeconds: %d is too short; %s, so use at least %d (or null to derive it)" (int $explicit) $why (int $minimum)) }}
{{- else }}
{{- int $explicit }}
{{- end }}
{{- end }}

{{/* The grace of an application's pod, in the shape sidecar.native picks. */}}
{{- define "acemq-sidecar.terminationGracePeriodSeconds" -}}
{{- include "acemq-sidecar.gracePeriod" (dict "scope" . "shape" (ternary "native" "classic" .Values.sidecar.native)) }}
{{- end }}

{{/*
Which Secret the broker's address comes from: "url" (broker.urlSecret) or "credentials"
(broker.credentialsSecret); exactly one must be named.
*/}}
{{- define "acemq-sidecar.brokerSecret" -}}
{{- $url := .Values.broker.urlSecret.name }}
{{- $credentials := .Values.broker.credentialsSecret.name }}
{{- if and $url $credentials }}
{{- fail "broker: name one Secret, broker.urlSecret.name (a URL) or broker.credentialsSecret.name (username, password, host, port), not both" }}
{{- else if $url }}url
{{- else if $credentials }}credentials
{{- else }}
{{- fail "broker: name the existing Secret: broker.urlSecret.name (one key holding the URL) or broker.credentialsSecret.name (username, password, host, port, as the RabbitMQ operators make it)" }}
{{- end }}
{{- end }}

{{/* Where the login files of broker.credentialsSecret are mounted. */}}
{{- define "acemq-sidecar.brokerDir" -}}
/etc/acemq-sidecar-broker
{{- end }}

{{/*
The container's and the pod's securityContext: as given, less runAsUser, runAsGroup (and
fsGroup) with openshift.arbitraryUid, where the SCC assigns the namespace's uid.
*/}}
{{- define "acemq-sidecar.securityContext" -}}
{{- $context := deepCopy (.context | default dict) }}
{{- if .scope.Values.openshift.arbitraryUid }}
{{- $context = omit $context "runAsUser" "runAsGroup" "fsGroup" }}
{{- end }}
{{- toYaml $context }}
{{- end }}

{{/* Whether pods are expected at all times: "true" or "" (replicas, or an autoscaler's floor). */}}
{{- define "acemq-sidecar.podsExpected" -}}
{{- $values := .Values }}
{{- if $values.deployment.enabled }}
{{- if $values.keda.enabled }}
{{- if gt (int $values.keda.minReplicaCount) 0 }}true{{ end }}
{{- else if $values.autoscaling.enabled }}true
{{- else if gt (int $values.deployment.replicas) 0 }}true
{{- end }}
{{- end }}
{{- end }}

{{/*
What no schema can say, checked where the chart's own root context is (the route map's
ConfigMap always renders, also as an application chart's dependency).
*/}}
{{- define "acemq-sidecar.checks" -}}
{{- $values := .Values }}
{{- $_ := include "acemq-sidecar.brokerSecret" . }}
{{- if and $values.sidecar.native (not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version)) }}
{{- fail (printf "sidecar.native: a native sidecar (an init container with restartPolicy: Always) needs Kubernetes 1.29 or newer, and this cluster is %s; use sidecar.native=false (acemq-sidecar.container)" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if and $values.serviceMonitor.enabled $values.podMonitor.enabled }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled: enable one; both would scrape the same pods under two jobs, and every alert would fire twice" }}
{{- end }}
{{- if and $values.autoscaling.enabled $values.keda.enabled }}
{{- fail "autoscaling.enabled and keda.enabled: enable one; KEDA makes a HorizontalPodAutoscaler of its own, and two would fight over the replicas" }}
{{- end }}
{{- if and (or $values.autoscaling.enabled $values.keda.enabled) (not $values.deployment.enabled) }}
{{- fail "autoscaling and keda scale the standalone Deployment (deployment.enabled); in your application's pods, scale your own workload" }}
{{- end }}
{{- if and $values.autoscaling.enabled (gt (int $values.autoscaling.minReplicas) (int $values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling: minReplicas %d is above maxReplicas %d" (int $values.autoscaling.minReplicas) (int $values.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and $values.autoscaling.enabled (kindIs "invalid" $values.autoscaling.targetCPUUtilizationPercentage) (kindIs "invalid" $values.autoscaling.targetMemoryUtilizationPercentage) }}
{{- fail "autoscaling: set targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage (or use keda, on queue depth)" }}
{{- end }}
{{- if and $values.keda.enabled (gt (int $values.keda.minReplicaCount) (int $values.keda.maxReplicaCount)) }}
{{- fail (printf "keda: minReplicaCount %d is above maxReplicaCount %d" (int $values.keda.minReplicaCount) (int $values.keda.maxReplicaCount)) }}
{{- end }}
{{- end }}
