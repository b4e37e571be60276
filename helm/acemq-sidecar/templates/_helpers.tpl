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

{{/* registry/repository:tag, and @digest when pinned (the tag stays readable). */}}
{{- define "acemq-sidecar.image" -}}
{{- $image := .Values.image }}
{{- $repository := $image.repository }}
{{- with $image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- printf "%s:%s" $repository $image.tag }}
{{- with $image.digest }}@{{ . }}{{ end }}
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
{{- $_ := set $broker "url" (include "acemq-sidecar.credentialsUrl" (dict "scope" . "host" "${ACEMQ_BROKER_HOST}" "port" "${ACEMQ_BROKER_PORT}")) }}
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
{{- fail "broker: name one Secret, broker.urlSecret.name (a URL) or broker.credentialsSecret.name (a login, with broker.address or host and port keys), not both" }}
{{- else if $url }}url
{{- else if $credentials }}credentials
{{- else }}
{{- fail "broker: name the existing Secret: broker.urlSecret.name (one key holding the URL) or broker.credentialsSecret.name (username and password as the RabbitMQ operators write them; host and port from broker.address or the same Secret)" }}
{{- end }}
{{- end }}

{{/*
Where host and port go with broker.credentialsSecret, as YAML: {host, port} given as
values (broker.address.host), or {secret, hostKey, portKey}: the keys of
broker.address.secretName, else of the credentials Secret itself (the Cluster Operator's).
*/}}
{{- define "acemq-sidecar.brokerAddress" -}}
{{- $credentials := .Values.broker.credentialsSecret }}
{{- $address := .Values.broker.address | default dict }}
{{- $usesAddress := or $address.host $address.secretName (not (kindIs "invalid" $address.port)) }}
{{- if and $usesAddress (ne (include "acemq-sidecar.brokerSecret" .) "credentials") }}
{{- fail "broker.address: it gives the host and port of broker.credentialsSecret's login; with broker.urlSecret the URL names them: leave broker.address unset" }}
{{- end }}
{{- if and $address.host $address.secretName }}
{{- fail (printf "broker.address: host %q and secretName %q both give the broker's host; set one" $address.host $address.secretName) }}
{{- else if $address.host }}
host: {{ $address.host | quote }}
port: {{ $address.port | default (ternary 5671 5672 (eq $credentials.scheme "amqps")) | int }}
{{- else if not (kindIs "invalid" $address.port) }}
{{- fail (printf "broker.address.port %v: a port needs broker.address.host; or leave port null and name broker.address.secretName for both" $address.port) }}
{{- else if $address.secretName }}
secret: {{ $address.secretName | quote }}
hostKey: {{ $address.hostKey | quote }}
portKey: {{ $address.portKey | quote }}
{{- else }}
secret: {{ $credentials.name | quote }}
hostKey: {{ $credentials.hostKey | quote }}
portKey: {{ $credentials.portKey | quote }}
{{- end }}
{{- end }}

{{/*
The URL of broker.credentialsSecret without its login: scheme, host, port and the
percent-encoded vhost. (dict "scope" . "host" H "port" P), H and P used when the address
comes from a Secret (variables), the literal values otherwise.
*/}}
{{- define "acemq-sidecar.credentialsUrl" -}}
{{- $credentials := .scope.Values.broker.credentialsSecret }}
{{- $address := include "acemq-sidecar.brokerAddress" .scope | fromYaml }}
{{- $host := .host }}
{{- $port := .port }}
{{- if $address.host }}
{{- $host = $address.host }}
{{- $port = $address.port | toString }}
{{- end }}
{{- printf "%s://%s:%s/%s" $credentials.scheme $host $port ($credentials.vhost | urlquery | replace "+" "%20") }}
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
{{- $_ := include "acemq-sidecar.brokerAddress" . }}
{{- if and $values.sidecar.native (not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version)) }}
{{- fail (printf "sidecar.native: a native sidecar (an init container with restartPolicy: Always) needs Kubernetes 1.29 or newer, and this cluster is %s; use sidecar.native=false (acemq-sidecar.container)" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- include "acemq-sidecar.tlsScheme" . }}
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
{{- if $values.keda.enabled }}
{{- if and $values.keda.excludeUnacknowledged (ne $values.keda.protocol "http") }}
{{- fail "keda.excludeUnacknowledged: only protocol http counts unacknowledged messages (amqp counts ready ones only); set keda.protocol: http, or leave excludeUnacknowledged false" }}
{{- end }}
{{- if and (eq $values.keda.protocol "http") (not $values.keda.authenticationRef.name) (ne (include "acemq-sidecar.brokerSecret" .) "credentials") }}
{{- fail "keda.protocol http: broker.urlSecret holds an AMQP URL, not the management API's; use broker.credentialsSecret (the chart builds the http address of its host), or name a TriggerAuthentication with the http host in keda.authenticationRef" }}
{{- end }}
{{- end }}
{{- if and $values.keda.enabled (gt (int $values.keda.minReplicaCount) (int $values.keda.maxReplicaCount)) }}
{{- fail (printf "keda: minReplicaCount %d is above maxReplicaCount %d" (int $values.keda.minReplicaCount) (int $values.keda.maxReplicaCount)) }}
{{- end }}
{{- end }}


{{/*
tls.enabled needs an amqps:// broker: over amqp:// the sidecar refuses the TLS files (a
crash loop) or, without them, it and KEDA connect in plaintext. The scheme is a value with
broker.credentialsSecret; a URL Secret is checked when `helm install` or `upgrade` can
read it (lookup; `helm template` cannot, and the sidecar refuses the files at start).
*/}}
{{- define "acemq-sidecar.tlsScheme" -}}
{{- if .Values.tls.enabled }}
{{- if eq (include "acemq-sidecar.brokerSecret" .) "credentials" }}
{{- $scheme := .Values.broker.credentialsSecret.scheme }}
{{- if ne $scheme "amqps" }}
{{- fail (printf "tls.enabled: broker.credentialsSecret.scheme is %q, so the sidecar and KEDA would not use TLS (plaintext, or a crash loop with a client certificate); set broker.credentialsSecret.scheme: amqps (and the broker's TLS port, 5671), or tls.enabled: false" $scheme) }}
{{- end }}
{{- else }}
{{- $secret := .Values.broker.urlSecret }}
{{- $live := lookup "v1" "Secret" .Release.Namespace $secret.name | default dict }}
{{- $encoded := dig "data" $secret.key "" $live }}
{{- if $encoded }}
{{- $url := $encoded | b64dec | trim | lower }}
{{- if not (hasPrefix "amqps://" $url) }}
{{- fail (printf "tls.enabled: the URL in Secret %s, key %s, is not amqps://, so the sidecar and KEDA would not use TLS; put the broker's amqps:// URL (port 5671) in the Secret, or set tls.enabled: false" $secret.name $secret.key) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The broker's address for KEDA's rabbitmq trigger, no login in it: the AMQP URL, or with
keda.protocol http the management API's. Host and port from the container's variables
(KEDA expands $(VAR) as the kubelet does) or the values of broker.address.
*/}}
{{- define "acemq-sidecar.kedaAddress" -}}
{{- $keda := .Values.keda }}
{{- if eq $keda.protocol "http" }}
{{- $credentials := .Values.broker.credentialsSecret }}
{{- $address := include "acemq-sidecar.brokerAddress" . | fromYaml }}
{{- $host := $address.host | default "$(ACEMQ_BROKER_HOST)" }}
{{- printf "%s://%s:%v/%s" $keda.management.scheme $host $keda.management.port ($credentials.vhost | urlquery | replace "+" "%20") }}
{{- else }}
{{- include "acemq-sidecar.credentialsUrl" (dict "scope" . "host" "$(ACEMQ_BROKER_HOST)" "port" "$(ACEMQ_BROKER_PORT)") }}
{{- end }}
{{- end }}

{{/*
The helm test Pod's labels: the chart's, commonLabels and helmTest.podLabels, and
acemq-sidecar/test (which the NetworkPolicy lets in), never a label the chart's selectors
use, so no Service, budget or policy of the sidecar's pods selects it.
*/}}
{{- define "acemq-sidecar.testLabels" -}}
{{- $selectors := list "app.kubernetes.io/name" "app.kubernetes.io/instance" "acemq-sidecar/instance" }}
{{- $labels := dict "helm.sh/chart" (include "acemq-sidecar.chart" .) "app.kubernetes.io/version" (.Chart.AppVersion | toString) "app.kubernetes.io/managed-by" .Release.Service "app.kubernetes.io/part-of" "acemq" }}
{{- range $key, $value := (.Values.commonLabels | default dict) }}
{{- if not (has $key $selectors) }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- end }}
{{- range $key, $value := (.Values.helmTest.podLabels | default dict) }}
{{- if has $key $selectors }}
{{- fail (printf "helmTest.podLabels: %q is a label the chart's selectors use; the test Pod would become one of the sidecar's pods (a Service endpoint, under the NetworkPolicy): leave it out" $key) }}
{{- end }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- $_ := set $labels "app.kubernetes.io/component" "helm-test" }}
{{- $_ := set $labels "acemq-sidecar/test" (include "acemq-sidecar.fullname" .) }}
{{- toYaml $labels }}
{{- end }}

{{/*
The standalone Deployment's affinity: `affinity` as given, plus, unless it sets
podAntiAffinity, the podAntiAffinityPreset on podAntiAffinityTopologyKey ("soft": preferred,
weight 100; "hard": required; "": none), selecting this release's replicas.
*/}}
{{- define "acemq-sidecar.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- $preset := .Values.podAntiAffinityPreset }}
{{- if and $preset (not (hasKey $affinity "podAntiAffinity")) }}
{{- $term := dict "topologyKey" .Values.podAntiAffinityTopologyKey "labelSelector" (dict "matchLabels" (include "acemq-sidecar.selectorLabels" . | fromYaml)) }}
{{- if eq $preset "hard" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) }}
{{- else }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- end }}
{{- with $affinity }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
An alert's labels and annotations: severity and the chart's summary, description and
runbook_url, then the alert's own labels and annotations (prometheusRule.alerts.<name>),
which win. (dict "alert" $values "runbook" base "anchor" a "summary" s "description" d)
*/}}
{{- define "acemq-sidecar.alertMeta" -}}
{{- $labels := dict "severity" .alert.severity }}
{{- range $key, $value := (.alert.labels | default dict) }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- $annotations := dict "summary" .summary "description" .description }}
{{- with .runbook }}
{{- $_ := set $annotations "runbook_url" (printf "%s#%s" . $.anchor) }}
{{- end }}
{{- range $key, $value := (.alert.annotations | default dict) }}
{{- $_ := set $annotations $key (toString $value) }}
{{- end }}
labels:
  {{- toYaml $labels | nindent 2 }}
annotations:
  {{- toYaml $annotations | nindent 2 }}
{{- end }}

{{/*
The PrometheusRule's name: the full name in the release's namespace; in another one
(prometheusRule.namespace) "<full name>-<release namespace>", so that one release name in
two namespaces gives two rules there. At most 63 characters: a longer one is cut and ends
in a hash of namespace/full name, which keeps it unique.
*/}}
{{- define "acemq-sidecar.prometheusRuleName" -}}
{{- $fullname := include "acemq-sidecar.fullname" . }}
{{- $namespace := .Values.prometheusRule.namespace | default .Release.Namespace }}
{{- if eq $namespace .Release.Namespace }}
{{- $fullname }}
{{- else }}
{{- $name := printf "%s-%s" $fullname .Release.Namespace }}
{{- if gt (len $name) 63 }}
{{- $hash := printf "%s/%s" .Release.Namespace $fullname | sha256sum | trunc 8 }}
{{- $name = printf "%s-%s" ($name | trunc 54 | trimSuffix "-") $hash }}
{{- end }}
{{- $name }}
{{- end }}
{{- end }}
