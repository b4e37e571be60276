{{/*
The templates an application chart includes to run the sidecar in its own pods. Each
takes the scope described in _helpers.tpl; from an application chart that depends on this
one:

    {{- $acemq := dict "Values" (index .Values "acemq-sidecar") "Release" .Release }}
    spec:
      template:
        metadata:
          annotations:
            {{- include "acemq-sidecar.podAnnotations" $acemq | nindent 8 }}
        spec:
          terminationGracePeriodSeconds: {{ include "acemq-sidecar.terminationGracePeriodSeconds" $acemq }}
          containers:
            - name: app
              ...
            {{- include "acemq-sidecar.container" $acemq | nindent 12 }}
          volumes:
            {{- include "acemq-sidecar.volumes" $acemq | nindent 12 }}

This chart (the dependency) still renders the route map's ConfigMap, which the volume
refers to; set deployment.enabled=false for it so it adds no Deployment of its own.
*/}}

{{/* The sidecar container, as one item of a pod's containers list. */}}
{{- define "acemq-sidecar.container" -}}
- name: acemq-sidecar
  image: {{ include "acemq-sidecar.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  # The image's entrypoint is `acemq-sidecar run`; these are its arguments.
  args:
    - --config
    - {{ include "acemq-sidecar.configDir" . }}/routes.yaml
    - --log-level
    - {{ .Values.logLevel | quote }}
  env:
    # The route map's broker.url is "${AMQP_URL}": the URL stays in the Secret.
    - name: AMQP_URL
      valueFrom:
        secretKeyRef:
          name: {{ required "broker.urlSecret.name: name the existing Secret that holds the broker URL" .Values.broker.urlSecret.name }}
          key: {{ .Values.broker.urlSecret.key }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ .Values.portName }}
      containerPort: {{ include "acemq-sidecar.port" . }}
      protocol: TCP
  {{- if .Values.livenessProbe.enabled }}
  # /healthz: the event loop is running.
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ .Values.portName }}
    {{- toYaml (omit .Values.livenessProbe "enabled") | nindent 4 }}
  {{- end }}
  {{- if .Values.readinessProbe.enabled }}
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
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    # The directory, not a subPath: a changed ConfigMap reaches the file, and the
    # sidecar reloads it (it also rolls the pods, see acemq-sidecar.podAnnotations).
    - name: acemq-sidecar-config
      mountPath: {{ include "acemq-sidecar.configDir" . }}
      readOnly: true
    {{- if .Values.tls.enabled }}
    - name: acemq-sidecar-tls
      mountPath: {{ include "acemq-sidecar.tlsDir" . }}
      readOnly: true
    {{- end }}
{{- end }}

{{/* The sidecar's volumes, as items of a pod's volumes list. */}}
{{- define "acemq-sidecar.volumes" -}}
- name: acemq-sidecar-config
  configMap:
    name: {{ include "acemq-sidecar.configMapName" . }}
{{- if .Values.tls.enabled }}
- name: acemq-sidecar-tls
  secret:
    secretName: {{ required "tls.secretName: name the existing Secret with the TLS files" .Values.tls.secretName }}
    # Readable by the sidecar's user whatever the pod's fsGroup; only this container
    # mounts the volume.
    defaultMode: 0444
{{- end }}
{{- end }}

{{/* Pod annotations: a changed route map changes the pod template, so the pods roll. */}}
{{- define "acemq-sidecar.podAnnotations" -}}
checksum/acemq-sidecar-config: {{ include "acemq-sidecar.routeMap" . | sha256sum }}
{{- end }}
