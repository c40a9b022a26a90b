{{/*
The tailfloor sidecar, for this chart and for other charts that add tailfloor to their own
pod spec. Add this chart as a dependency, then in the pod spec:

  containers:
    - name: my-agent
      env:
        - name: OPENAI_BASE_URL
          value: http://127.0.0.1:8787/agents/my-agent/v1
      ...
    {{- include "tailfloor.sidecar" (dict "config" $cfg) | nindent 4 }}
  volumes:
    {{- include "tailfloor.sidecar.volumes" (dict "config" $cfg) | nindent 4 }}

where $cfg is a dict; only "image" is required:
  image           tailfloor image reference
  upstream        model API base URL (default https://api.openai.com)
  port            listen port (default 8787)
  adminPort       admin listener port: /metrics, /healthz, /readyz (default 8788)
  healthPort      the probes' port (default 8789): /healthz and /readyz answered by a small
                  process of their own, which asks tailfloor's event loop without waiting on
                  it: in milliseconds even while tailfloor is busy; point the probes at the
                  port named health (0: no health process, no such port, and probes of
                  that port go to admin). Two sidecars in one pod: give each its own port,
                  adminPort and healthPort
  introspection   also serve /tailfloor/* there (session ids, keys, paths; default false: the
                  admin port listens on the pod IP for probes and scrapes)
  transcripts     dict: volume (name of the pod volume holding the agent's transcripts),
                  mountPath (default /transcripts), readOnly (default false, see values.yaml)
  sessions        list of transcript paths inside the container (default: transcripts.mountPath)
  rules           dict: enabled, configMap (name), mountPath (default /etc/tailfloor/rules)
  state           dict: mountPath, volume (a volume source; default emptyDir)
  store           dict: the shared store for several replicas (Redis): url, or
                  urlSecret + urlKey (a URL with credentials); keySecret + keyKey (+
                  previousKeyKey while rotating): the key that signs shared values; passwordSecret + passwordKey
                  (mounted as a file, never an env value)
  tmp             dict: sizeLimit of the TMPDIR emptyDir
  inspector       dict: requests (kept per session, 0 = off), memoryBytes, content (message
                  text on the pages; default false)
  adminToken      dict: secret + key, a token the admin port asks for on every route but
                  the probes (mounted as a file)
  pullPolicy, hostPort, hostIP, logFormat, logLevel, shutdownGrace, extraArgs, env,
  extraVolumeMounts, resources, securityContext, livenessProbe, readinessProbe, startupProbe
*/}}
{{/*
A probe as configured; with no health process (healthPort 0) a probe of the port named
health goes to the admin listener, which answers the same paths.
*/}}
{{- define "tailfloor.probe" -}}
{{- $probe := deepCopy .probe -}}
{{- if not .healthPort -}}
{{- with $probe.httpGet -}}
{{- if eq (toString .port) "health" -}}
{{- $_ := set . "port" "admin" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}

{{- define "tailfloor.sidecar" -}}
{{- $c := .config -}}
{{- $port := default 8787 $c.port -}}
{{- $adminPort := default 8788 $c.adminPort -}}
{{- $healthPort := ternary 8789 $c.healthPort (kindIs "invalid" $c.healthPort) -}}
{{- $t := default dict $c.transcripts -}}
{{- $rules := default dict $c.rules -}}
{{- $state := default dict $c.state -}}
{{- $store := default dict $c.store -}}
{{- $inspector := default dict $c.inspector -}}
{{- $token := default dict $c.adminToken -}}
{{- $otel := default dict $c.otel -}}
{{- $sessions := $c.sessions -}}
{{- if and (not $sessions) $t.volume -}}
{{- $sessions = list (default "/transcripts" $t.mountPath) -}}
{{- end -}}
- name: tailfloor
  image: {{ required "tailfloor.sidecar: config.image is required" $c.image | quote }}
  imagePullPolicy: {{ default "IfNotPresent" $c.pullPolicy }}
  {{- with $c.extraArgs }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    - name: TAILFLOOR_LISTEN
      value: {{ printf "0.0.0.0:%v" $port | quote }}
    - name: TAILFLOOR_ADMIN_LISTEN
      value: {{ printf "0.0.0.0:%v" $adminPort | quote }}
    {{- if $healthPort }}
    - name: TAILFLOOR_HEALTH_LISTEN
      value: {{ printf "0.0.0.0:%v" $healthPort | quote }}
    {{- end }}
    - name: TAILFLOOR_INTROSPECTION
      value: {{ ternary "true" "false" (eq (toString $c.introspection) "true") | quote }}
    - name: TAILFLOOR_UPSTREAM
      value: {{ default "https://api.openai.com" $c.upstream | quote }}
    - name: TAILFLOOR_LOG_FORMAT
      value: {{ default "json" $c.logFormat | quote }}
    - name: TAILFLOOR_LOG_LEVEL
      value: {{ default "INFO" $c.logLevel | quote }}
    - name: TAILFLOOR_SHUTDOWN_GRACE
      value: {{ default 30 $c.shutdownGrace | quote }}
    - name: TAILFLOOR_STATE
      value: {{ default "/var/lib/tailfloor" $state.mountPath | quote }}
    {{- with $sessions }}
    - name: TAILFLOOR_SESSIONS
      value: {{ join ":" . | quote }}
    {{- end }}
    {{- if $rules.enabled }}
    - name: TAILFLOOR_RULES
      value: {{ default "/etc/tailfloor/rules" $rules.mountPath | quote }}
    {{- end }}
    {{- if $store.urlSecret }}
    - name: TAILFLOOR_STORE
      valueFrom:
        secretKeyRef:
          name: {{ $store.urlSecret | quote }}
          key: {{ default "url" $store.urlKey | quote }}
    {{- else if $store.url }}
    - name: TAILFLOOR_STORE
      value: {{ $store.url | quote }}
    {{- end }}
    {{- if $store.passwordSecret }}
    - name: TAILFLOOR_STORE_PASSWORD_FILE
      value: {{ printf "/etc/tailfloor/store/%s" (default "password" $store.passwordKey) | quote }}
    {{- end }}
    - name: TAILFLOOR_INSPECT_REQUESTS
      value: {{ ternary 20 $inspector.requests (kindIs "invalid" $inspector.requests) | quote }}
    {{- with $inspector.memoryBytes }}
    - name: TAILFLOOR_INSPECT_MEMORY_BYTES
      value: {{ . | int64 | quote }}
    {{- end }}
    - name: TAILFLOOR_INSPECT_CONTENT
      value: {{ ternary "true" "false" (eq (toString $inspector.content) "true") | quote }}
    {{- if $token.secret }}
    - name: TAILFLOOR_ADMIN_TOKEN_FILE
      value: {{ printf "/etc/tailfloor/admin/%s" (default "token" $token.key) | quote }}
    {{- end }}
    {{- if $store.keySecret }}
    - name: TAILFLOOR_STORE_KEY_FILE
      value: {{ printf "/etc/tailfloor/store-key/%s" (default "key" $store.keyKey) | quote }}
    {{- if $store.previousKeyKey }}
    - name: TAILFLOOR_STORE_PREVIOUS_KEY_FILE
      value: {{ printf "/etc/tailfloor/store-key/%s" $store.previousKeyKey | quote }}
    {{- end }}
    {{- end }}
    {{- if $otel.endpoint }}
    - name: OTEL_EXPORTER_OTLP_ENDPOINT
      value: {{ $otel.endpoint | quote }}
    - name: OTEL_SERVICE_NAME
      value: {{ default "tailfloor" $otel.serviceName | quote }}
    {{- if $otel.headersSecret }}
    - name: OTEL_EXPORTER_OTLP_HEADERS
      valueFrom:
        secretKeyRef:
          name: {{ $otel.headersSecret | quote }}
          key: {{ default "headers" $otel.headersKey | quote }}
    {{- end }}
    {{- end }}
    - name: TMPDIR
      value: /tmp
    {{- with $c.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: tailfloor
      containerPort: {{ $port }}
      protocol: TCP
      {{- if $c.hostPort }}
      hostPort: {{ $c.hostPort }}
      {{- with $c.hostIP }}
      hostIP: {{ . | quote }}
      {{- end }}
      {{- end }}
    - name: admin
      containerPort: {{ $adminPort }}
      protocol: TCP
    {{- if $healthPort }}
    - name: health
      containerPort: {{ $healthPort }}
      protocol: TCP
    {{- end }}
  {{- with $c.livenessProbe }}
  livenessProbe:
    {{- include "tailfloor.probe" (dict "probe" . "healthPort" $healthPort) | nindent 4 }}
  {{- end }}
  {{- with $c.readinessProbe }}
  readinessProbe:
    {{- include "tailfloor.probe" (dict "probe" . "healthPort" $healthPort) | nindent 4 }}
  {{- end }}
  {{- with $c.startupProbe }}
  startupProbe:
    {{- include "tailfloor.probe" (dict "probe" . "healthPort" $healthPort) | nindent 4 }}
  {{- end }}
  {{- with $c.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml (default (dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL"))) $c.securityContext) | nindent 4 }}
  volumeMounts:
    {{- if $t.volume }}
    - name: {{ $t.volume }}
      mountPath: {{ default "/transcripts" $t.mountPath }}
      readOnly: {{ default false $t.readOnly }}
    {{- end }}
    {{- if $rules.enabled }}
    - name: tailfloor-rules
      mountPath: {{ default "/etc/tailfloor/rules" $rules.mountPath }}
      readOnly: true
    {{- end }}
    - name: tailfloor-state
      mountPath: {{ default "/var/lib/tailfloor" $state.mountPath }}
    - name: tailfloor-tmp
      mountPath: /tmp
    {{- if $store.passwordSecret }}
    - name: tailfloor-store
      mountPath: /etc/tailfloor/store
      readOnly: true
    {{- end }}
    {{- if $token.secret }}
    - name: tailfloor-admin-token
      mountPath: /etc/tailfloor/admin
      readOnly: true
    {{- end }}
    {{- if $store.keySecret }}
    - name: tailfloor-store-key
      mountPath: /etc/tailfloor/store-key
      readOnly: true
    {{- end }}
    {{- with $c.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* The volumes the sidecar mounts besides the transcripts volume (which the pod owns). */}}
{{- define "tailfloor.sidecar.volumes" -}}
{{- $c := .config -}}
{{- $rules := default dict $c.rules -}}
{{- $state := default dict $c.state -}}
{{- $tmp := default dict $c.tmp -}}
{{- $store := default dict $c.store -}}
{{- $token := default dict $c.adminToken -}}
- name: tailfloor-state
  {{- toYaml (default (dict "emptyDir" (dict)) $state.volume) | nindent 2 }}
- name: tailfloor-tmp
  emptyDir:
    medium: Memory
    sizeLimit: {{ default "64Mi" $tmp.sizeLimit }}
{{- if $store.passwordSecret }}
- name: tailfloor-store
  secret:
    secretName: {{ $store.passwordSecret | quote }}
    defaultMode: 0440  # root:fsGroup, readable by the pod's group only
    items:
      - key: {{ default "password" $store.passwordKey | quote }}
        path: {{ default "password" $store.passwordKey | quote }}
{{- end }}
{{- if $token.secret }}
- name: tailfloor-admin-token
  secret:
    secretName: {{ $token.secret | quote }}
    defaultMode: 0440
    items:
      - key: {{ default "token" $token.key | quote }}
        path: {{ default "token" $token.key | quote }}
{{- end }}
{{- if $store.keySecret }}
- name: tailfloor-store-key
  secret:
    secretName: {{ $store.keySecret | quote }}
    defaultMode: 0440
    items:
      - key: {{ default "key" $store.keyKey | quote }}
        path: {{ default "key" $store.keyKey | quote }}
      {{- if $store.previousKeyKey }}
      - key: {{ $store.previousKeyKey | quote }}
        path: {{ $store.previousKeyKey | quote }}
      {{- end }}
{{- end }}
{{- if $rules.enabled }}
- name: tailfloor-rules
  configMap:
    name: {{ required "tailfloor.sidecar.volumes: config.rules.configMap is required when rules are enabled" $rules.configMap }}
{{- end }}
{{- end -}}
