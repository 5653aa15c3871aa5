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
{{- include "ca-asg-provider.imageRef" (dict "image" .Values.image "tag" (include "ca-asg-provider.imageTag" .)) -}}
{{- end -}}

{{/*
cluster-autoscaler's tag in bundled mode: clusterAutoscaler.image.tag when set, else the
row of clusterAutoscaler.image.tagsByKubernetesMinor for the cluster's Kubernetes minor
(.Capabilities.KubeVersion: the cluster's at `helm install`, --kube-version at `helm
template`). Either must be a CA release tag, v1.MINOR.PATCH; a minor without a row fails,
naming it, unless a digest pins the image (the tag is then only its label).
*/}}
{{- define "ca-asg-provider.caImageTag" -}}
{{- $img := .Values.clusterAutoscaler.image -}}
{{- $form := "^v1\\.[0-9]+\\.[0-9]+(-[0-9A-Za-z.]+)?$" -}}
{{- $kube := .Capabilities.KubeVersion -}}
{{- $minor := regexReplaceAll "[^0-9]" (toString $kube.Minor) "" -}}
{{- range $m, $row := $img.tagsByKubernetesMinor | default dict -}}
{{- if not (regexMatch (printf "^v1\\.%s\\.[0-9]+$" $m) (toString $row)) -}}
{{- fail (printf "clusterAutoscaler.image.tagsByKubernetesMinor.%s %q is not a cluster-autoscaler release tag of that minor (v1.%s.PATCH)" $m (toString $row) $m) -}}
{{- end -}}
{{- end -}}
{{- if $img.tag -}}
{{- if not (regexMatch $form (toString $img.tag)) -}}
{{- fail (printf "clusterAutoscaler.image.tag %q is not a cluster-autoscaler release tag: v1.MINOR.PATCH, e.g. v1.%s.0 for this cluster's Kubernetes %s (or leave it empty: the chart then takes the newest patch it knows of the cluster's minor)" (toString $img.tag) $minor $kube.Version) -}}
{{- end -}}
{{- toString $img.tag -}}
{{- else -}}
{{- $row := get ($img.tagsByKubernetesMinor | default dict) $minor -}}
{{- if $row -}}
{{- toString $row -}}
{{- else if not $img.digest -}}
{{- $known := keys ($img.tagsByKubernetesMinor | default dict) | sortAlpha -}}
{{- fail (printf "clusterAutoscaler.image.tag is empty and this chart knows no cluster-autoscaler for Kubernetes %s (.Capabilities.KubeVersion; it knows the minors %s in clusterAutoscaler.image.tagsByKubernetesMinor): set clusterAutoscaler.image.tag to CA's newest v1.%s.x (https://github.com/kubernetes/autoscaler/releases)" $kube.Version (join ", " $known) $minor) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* cluster-autoscaler's image reference in bundled mode. */}}
{{- define "ca-asg-provider.caImage" -}}
{{- include "ca-asg-provider.imageRef" (dict "image" .Values.clusterAutoscaler.image "tag" (include "ca-asg-provider.caImageTag" .)) -}}
{{- end -}}

{{/* repository[:tag][@digest] of an image value ({image, tag}). */}}
{{- define "ca-asg-provider.imageRef" -}}
{{- $ref := .image.repository -}}
{{- if .tag }}{{ $ref = printf "%s:%s" $ref .tag }}{{ end -}}
{{- if .image.digest }}{{ $ref = printf "%s@%s" $ref .image.digest }}{{ end -}}
{{- $ref -}}
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

{{/*
Where cluster-autoscaler reaches the provider in its pod (sidecar and bundled): the
socket file in socketDir, or 127.0.0.1 with transport tcp. The provider's listen and
CA's cloud-config address are both this.
*/}}
{{- define "ca-asg-provider.inPodAddress" -}}
{{- if eq .Values.transport "unix" -}}
unix://{{ trimSuffix "/" .Values.socketDir }}/grpc.sock
{{- else -}}
127.0.0.1:{{ int .Values.ports.grpc }}
{{- end -}}
{{- end -}}

{{/* Where the config file is mounted, in both modes (the sidecar example uses it too). */}}
{{- define "ca-asg-provider.configDir" -}}/etc/ca-asg-provider/config{{- end -}}

{{/*
The provider's configuration: .Values.config, with autoDiscovery derived from clusterName,
and listen, metricsListen and (standalone) tls filled in from mode, ports and
tls.mountPath where config does not set them.
*/}}
{{- define "ca-asg-provider.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if .Values.clusterName -}}
{{- $_ := set $cfg "autoDiscovery" (list (dict "tags" (list "k8s.io/cluster-autoscaler/enabled" (printf "k8s.io/cluster-autoscaler/%s" .Values.clusterName)))) -}}
{{- end -}}
{{- if ne .Values.mode "standalone" -}}
{{- if not (hasKey $cfg "listen") -}}
{{- $_ := set $cfg "listen" (include "ca-asg-provider.inPodAddress" .) -}}
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
{{- fail "serviceAccount.annotations has no effect in sidecar mode: the provider runs under CA's ServiceAccount; annotate that one in CA's chart (rbac.serviceAccount.annotations)" -}}
{{- end -}}
{{- include "ca-asg-provider.checkUnused" . -}}
{{- $scaleIn := .Values.config.scaleIn | default dict -}}
{{- if and $scaleIn.leaseNamespace (ne $scaleIn.leaseNamespace .Release.Namespace) -}}
{{- fail (printf "config.scaleIn.leaseNamespace %q: the chart's Role grants the Lease in the release namespace %q only" $scaleIn.leaseNamespace .Release.Namespace) -}}
{{- end -}}
{{- if and (ne .Values.mode "sidecar") (gt (int .Values.replicas) 1) (eq (toString $scaleIn.leaderElection) "false") -}}
{{- fail (printf "replicas %d with config.scaleIn.leaderElection false: every replica would run the drain loop; set replicas to 1 or turn leader election on" (int .Values.replicas)) -}}
{{- end -}}
{{- $pdb := .Values.podDisruptionBudget -}}
{{- if and (ne .Values.mode "sidecar") $pdb.enabled -}}
{{- $replicas := int .Values.replicas -}}
{{- if and (hasKey $pdb "minAvailable") (not (kindIs "string" $pdb.minAvailable)) (ge (int $pdb.minAvailable) $replicas) (gt $replicas 0) -}}
{{- fail (printf "podDisruptionBudget.minAvailable %d with replicas %d allows no eviction: no node a replica runs on could ever be drained (by CA's scale-in, this service or kubectl drain); set replicas above it, or use maxUnavailable: 1" (int $pdb.minAvailable) $replicas) -}}
{{- end -}}
{{- if and (not (hasKey $pdb "minAvailable")) (hasKey $pdb "maxUnavailable") (not (kindIs "string" $pdb.maxUnavailable)) (eq (int $pdb.maxUnavailable) 0) -}}
{{- fail "podDisruptionBudget.maxUnavailable 0 allows no eviction: no node a replica runs on could ever be drained (by CA's scale-in, this service or kubectl drain); use 1 with replicas 2 or more (the default)" -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.mode "standalone") (not .Values.tls.certManager.enabled) (not .Values.tls.serverSecretName) -}}
{{- fail "tls.serverSecretName is required in standalone mode when tls.certManager.enabled is false" -}}
{{- end -}}
{{- include "ca-asg-provider.checkGroups" . -}}
{{- include "ca-asg-provider.checkPlaceholders" . -}}
{{- if and (ne .Values.mode "standalone") (eq .Values.transport "unix") (ne (int .Values.ports.grpc) 8086) -}}
{{- fail (printf "ports.grpc has no effect in %s mode with transport unix (it is %d): cluster-autoscaler reaches the provider on its socket in socketDir (set transport: tcp to use the port, or leave ports.grpc out)" .Values.mode (int .Values.ports.grpc)) -}}
{{- end -}}
{{- end -}}

{{/*
The cluster name is given once: clusterName, from which the discovery tags are derived,
or config.autoDiscovery / config.nodeGroups written out; never none, never both ways.
*/}}
{{- define "ca-asg-provider.checkGroups" -}}
{{- $cfg := .Values.config | default dict -}}
{{- if and .Values.clusterName $cfg.autoDiscovery -}}
{{- fail (printf "clusterName %q and config.autoDiscovery are both set: the chart derives the discovery tags [k8s.io/cluster-autoscaler/enabled, k8s.io/cluster-autoscaler/%s] from clusterName; set one of the two" .Values.clusterName .Values.clusterName) -}}
{{- end -}}
{{- if not (or .Values.clusterName $cfg.autoDiscovery $cfg.nodeGroups) -}}
{{- fail "clusterName is required: set clusterName to your cluster's name (the ASGs to manage carry the tags k8s.io/cluster-autoscaler/enabled and k8s.io/cluster-autoscaler/<clusterName>; docs/quickstart-eks.md, step 5), or list the groups in config.nodeGroups or config.autoDiscovery" -}}
{{- end -}}
{{- end -}}

{{/*
No install that can only fail later: values.yaml's image repository (where the provider
container runs: standalone and bundled) is a placeholder, and so is the examples' cluster
name my-cluster; the chart refuses them, naming the value to set.
*/}}
{{- define "ca-asg-provider.checkPlaceholders" -}}
{{- if and (ne .Values.mode "sidecar") (eq .Values.image.repository "ghcr.io/example/ca-asg-provider") -}}
{{- fail (printf "image.repository is the placeholder %q: set image.repository to the repository you pushed the ca-asg-provider image to (docs/quickstart-eks.md, step 2)" .Values.image.repository) -}}
{{- end -}}
{{- if .Values.prometheusRule.enabled -}}
{{- $runbook := .Values.prometheusRule.runbookBaseUrl -}}
{{- if not $runbook -}}
{{- fail "prometheusRule.runbookBaseUrl is required with prometheusRule.enabled: set it to where docs/operations.md is served for your team (e.g. https://github.com/<your-org>/ca-asg-provider/blob/<tag>/docs/operations.md); each alert links <runbookBaseUrl>#<alert name in lower case>" -}}
{{- end -}}
{{- if regexMatch "^https?://([^/]*\\.)?(example\\.(com|org|net)|github\\.com/example)(/|$)" $runbook -}}
{{- fail (printf "prometheusRule.runbookBaseUrl is an example URL (%q): set it to where docs/operations.md is served for your team; alerts would link runbooks that do not exist" $runbook) -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.clusterName "my-cluster" -}}
{{- fail "clusterName is the placeholder my-cluster: set clusterName to your cluster's name (the ASGs carry the tag k8s.io/cluster-autoscaler/<clusterName>)" -}}
{{- end -}}
{{- range $i, $d := .Values.config.autoDiscovery | default list -}}
{{- range $d.tags | default list -}}
{{- if regexMatch "^k8s\\.io/cluster-autoscaler/my-cluster(=.*)?$" . -}}
{{- fail (printf "config.autoDiscovery[%d].tags names the placeholder cluster my-cluster (%q): set clusterName to your cluster's name instead (the chart derives the tags), or config.autoDiscovery[%d].tags to the tags on your ASGs" $i . $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .Values.nodeSelector | default dict -}}
{{- if eq (toString $v) "my-system-nodegroup" -}}
{{- fail (printf "nodeSelector.%s is the placeholder my-system-nodegroup: set it to a node group this service does not scale in (not tagged for it), where its pods run" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Values that have no effect in a mode fail the render when they differ from values.yaml's
defaults (read from the chart itself), so that nothing is silently ignored: in sidecar
mode the provider's container and pod are written in cluster-autoscaler's chart, not
here.
*/}}
{{- define "ca-asg-provider.unusedByMode" -}}
{{- $sidecarPod := "in sidecar mode the provider's container runs in cluster-autoscaler's pod, written in CA's chart values (deploy/chart/examples/cluster-autoscaler-values.yaml); set it there, or use mode: bundled, where this chart renders CA's pod" -}}
{{- $caChart := "it is cluster-autoscaler's container in bundled mode (this chart runs CA only then)" -}}
sidecar:
  - why: {{ $sidecarPod | quote }}
    paths: [dryRun, image, imagePullSecrets, logFormat, logLevel, extraEnv, envFrom, extraArgs,
      extraVolumes, extraVolumeMounts, resources, securityContext,
      readinessProbe, livenessProbe, podSecurityContext, podAnnotations, podLabels, scrapeAnnotations,
      replicas, revisionHistoryLimit, terminationGracePeriodSeconds, priorityClassName, nodeSelector,
      strategy, tolerations, affinity, avoidNodesLabelled, topologySpreadConstraints, podDisruptionBudget,
      serviceAccount, uninstall]
  - why: "it is standalone mode's (CA reaches the sidecar on 127.0.0.1, without a Service or TLS)"
    paths: [service, tls, clusterAutoscaler.cloudConfig.tlsMountPath]
  - why: {{ $caChart | quote }}
    paths: [clusterAutoscaler.image, clusterAutoscaler.flags, clusterAutoscaler.resources]
standalone:
  - why: "it describes cluster-autoscaler's pod in sidecar mode"
    paths: [clusterAutoscaler.serviceAccountName, clusterAutoscaler.podLabels]
  - why: "it is how CA reaches the provider inside one pod (sidecar, bundled); standalone serves TCP with mTLS behind the Service"
    paths: [transport, socketDir]
  - why: {{ $caChart | quote }}
    paths: [clusterAutoscaler.image, clusterAutoscaler.flags, clusterAutoscaler.resources]
bundled:
  - why: "it describes cluster-autoscaler's pod in sidecar mode (bundled: CA's pod is this chart's; its ServiceAccount is serviceAccount)"
    paths: [clusterAutoscaler.serviceAccountName, clusterAutoscaler.podLabels]
  - why: "it is standalone mode's (CA reaches the provider in its own pod on 127.0.0.1, without a Service or TLS)"
    paths: [service, tls, clusterAutoscaler.cloudConfig.tlsMountPath]
{{- end -}}

{{- define "ca-asg-provider.checkUnused" -}}
{{- /* Helm hides values.yaml from .Files; files/defaults.yaml is a copy of it
(tests/deploy/validate.py fails when the two differ). */ -}}
{{- $defaults := .Files.Get "files/defaults.yaml" | fromYaml -}}
{{- if not (hasKey $defaults "mode") -}}
{{- fail "files/defaults.yaml must be a copy of the chart's values.yaml: the mode checks compare against it" -}}
{{- end -}}
{{- $mode := .Values.mode -}}
{{- range $rules := get (include "ca-asg-provider.unusedByMode" . | fromYaml) $mode | default list -}}
{{- range $path := $rules.paths -}}
{{- $v := $.Values -}}
{{- $d := $defaults -}}
{{- range $k := splitList "." $path -}}
{{- $v = get $v $k -}}
{{- $d = get $d $k -}}
{{- end -}}
{{- if ne (toJson $v) (toJson $d) -}}
{{- if and (eq $path "dryRun") (eq $mode "sidecar") -}}
{{- fail (printf "dryRun has no effect in sidecar mode, and the provider would really drain: %s (there: add --dry-run to the ca-asg-provider container's args)" $rules.why) -}}
{{- end -}}
{{- fail (printf "%s has no effect in %s mode: %s (set %s to its default, or leave it out)" $path $mode $rules.why $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
