{{/* Names and labels. */}}
{{- define "tailfloor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tailfloor.fullname" -}}
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

{{- define "tailfloor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailfloor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tailfloor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tailfloor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tailfloor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tailfloor.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tailfloor.rulesConfigMapName" -}}
{{- default (printf "%s-rules" (include "tailfloor.fullname" .)) .Values.tailfloor.rules.existingConfigMap -}}
{{- end -}}

{{/* The base URL an agent in the same pod uses: http://127.0.0.1:<port>. */}}
{{- define "tailfloor.localBaseUrl" -}}
{{- printf "http://127.0.0.1:%v" .Values.tailfloor.port -}}
{{- end -}}

{{/* The base URL agents on other pods use (standalone mode). */}}
{{- define "tailfloor.serviceBaseUrl" -}}
{{- printf "http://%s.%s.svc:%v" (include "tailfloor.fullname" .) .Release.Namespace .Values.service.port -}}
{{- end -}}

{{- define "tailfloor.image" -}}
{{- printf "%s:%s" .Values.tailfloor.image.repository (default .Chart.AppVersion .Values.tailfloor.image.tag) -}}
{{- end -}}

{{/* The admin Service (metrics, probes, introspection): only for monitoring. */}}
{{- define "tailfloor.adminServiceEnabled" -}}
{{- if .Values.monitoring.serviceMonitor.enabled -}}true{{- end -}}
{{- end -}}

{{- define "tailfloor.serviceEnabled" -}}
{{- if or (eq .Values.mode "standalone") .Values.service.enabled -}}true{{- end -}}
{{- end -}}

{{/* The tailfloor sidecar settings of this chart, in the shape "tailfloor.sidecar" takes. */}}
{{- define "tailfloor.sidecarConfig" -}}
{{- $t := .Values.tailfloor -}}
{{- $sessions := $t.sessions -}}
{{- if and (eq .Values.mode "sidecar") (not $sessions) -}}
{{- $sessions = list $t.transcripts.mountPath -}}
{{- end -}}
{{- $transcripts := dict -}}
{{- if eq .Values.mode "sidecar" -}}
{{- $transcripts = dict "volume" .Values.agent.stateVolume.name "mountPath" $t.transcripts.mountPath "readOnly" $t.transcripts.readOnly -}}
{{- end -}}
{{- $rules := dict "enabled" $t.rules.enabled "configMap" (include "tailfloor.rulesConfigMapName" .) "mountPath" $t.rules.mountPath -}}
{{- $cfg := dict "image" (include "tailfloor.image" .) "pullPolicy" $t.image.pullPolicy "port" $t.port "adminPort" $t.adminPort "healthPort" $t.healthPort "introspection" $t.introspection "hostPort" $t.hostPort "hostIP" $t.hostIP "upstream" $t.upstream "logFormat" $t.logFormat "logLevel" $t.logLevel "sessions" $sessions "shutdownGrace" $t.shutdownGrace "extraArgs" $t.extraArgs "env" $t.env "extraVolumeMounts" $t.extraVolumeMounts "resources" $t.resources "securityContext" $t.securityContext "livenessProbe" $t.livenessProbe "readinessProbe" $t.readinessProbe "startupProbe" $t.startupProbe "transcripts" $transcripts "rules" $rules "state" $t.state "tmp" $t.tmp "store" $t.store "inspector" $t.inspector "adminToken" $t.adminToken "otel" .Values.otel -}}
{{- toYaml $cfg -}}
{{- end -}}
