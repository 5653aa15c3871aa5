{{/* Chart name, truncated for label values. */}}
{{- define "ca-asg-provider.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The name of every object: the release name when it contains the chart name. */}}
{{- define "ca-asg-provider.fullname" -}}
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

{{- define "ca-asg-provider.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ca-asg-provider.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ca-asg-provider.labels" -}}
{{ include "ca-asg-provider.selectorLabels" . }}
app.kubernetes.io/version: {{ include "ca-asg-provider.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ca-asg-provider.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "ca-asg-provider.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "ca-asg-provider.imageTag" .) -}}
{{- end -}}

{{/* The ServiceAccount the provider runs under: CA's (sidecar) or its own (standalone). */}}
{{- define "ca-asg-provider.serviceAccountName" -}}
{{- if eq .Values.mode "sidecar" -}}
{{- required "clusterAutoscaler.serviceAccountName is required in sidecar mode" .Values.clusterAutoscaler.serviceAccountName -}}
{{- else if .Values.serviceAccount.create -}}
{{- default (include "ca-asg-provider.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ca-asg-provider.serverSecretName" -}}
{{- default (printf "%s-server-tls" (include "ca-asg-provider.fullname" .)) .Values.tls.serverSecretName -}}
{{- end -}}

{{/* The Service's in-cluster DNS name (standalone). */}}
{{- define "ca-asg-provider.serviceHost" -}}
{{- printf "%s.%s.svc" (include "ca-asg-provider.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Where the config file is mounted, in both modes (the sidecar example uses it too). */}}
{{- define "ca-asg-provider.configDir" -}}/etc/ca-asg-provider/config{{- end -}}

{{/*
The provider's configuration: .Values.config, with listen, metricsListen and (standalone)
tls filled in from mode, ports and tls.mountPath where config does not set them.
*/}}
{{- define "ca-asg-provider.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if eq .Values.mode "sidecar" -}}
{{- if not (hasKey $cfg "listen") -}}
{{- $_ := set $cfg "listen" (printf "127.0.0.1:%d" (int .Values.ports.grpc)) -}}
{{- end -}}
{{- else -}}
{{- if not (hasKey $cfg "listen") -}}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.ports.grpc)) -}}
{{- end -}}
{{- if not (hasKey $cfg "tls") -}}
{{- $dir := .Values.tls.mountPath -}}
{{- $_ := set $cfg "tls" (dict "cert" (printf "%s/tls.crt" $dir) "key" (printf "%s/tls.key" $dir) "clientCA" (printf "%s/ca.crt" $dir)) -}}
{{- end -}}
{{- end -}}
{{- if not (hasKey $cfg "metricsListen") -}}
{{- $_ := set $cfg "metricsListen" (printf "0.0.0.0:%d" (int .Values.ports.metrics)) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The leader-election Lease the Role grants: config.scaleIn.leaseName or the program's default. */}}
{{- define "ca-asg-provider.leaseName" -}}
{{- $scaleIn := .Values.config.scaleIn | default dict -}}
{{- $scaleIn.leaseName | default "ca-asg-provider" -}}
{{- end -}}

{{/* Fails on combinations the schema cannot express. */}}
{{- define "ca-asg-provider.checks" -}}
{{- if and (eq .Values.mode "sidecar") .Values.serviceAccount.annotations -}}
{{- fail "serviceAccount.annotations apply to standalone mode only: in sidecar mode the provider runs under CA's ServiceAccount; annotate it in CA's chart (rbac.serviceAccount.annotations)" -}}
{{- end -}}
{{- $scaleIn := .Values.config.scaleIn | default dict -}}
{{- if and $scaleIn.leaseNamespace (ne $scaleIn.leaseNamespace .Release.Namespace) -}}
{{- fail (printf "config.scaleIn.leaseNamespace %q: the chart's Role grants the Lease in the release namespace %q only" $scaleIn.leaseNamespace .Release.Namespace) -}}
{{- end -}}
{{- if and (eq .Values.mode "standalone") (not .Values.tls.certManager.enabled) (not .Values.tls.serverSecretName) -}}
{{- fail "tls.serverSecretName is required in standalone mode when tls.certManager.enabled is false" -}}
{{- end -}}
{{- end -}}
