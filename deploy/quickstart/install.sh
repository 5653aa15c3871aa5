#!/usr/bin/env bash
# Installs ca-asg-provider with Helm (or brings an installed release to these inputs) and
# waits until its pods are Ready.
#
# Inputs (environment):
#   CHART             required: the chart, a directory (deploy/chart) or an OCI reference
#                     (oci://REGISTRY/PATH/ca-asg-provider, pinned by digest with
#                     @sha256:DIGEST at its end)
#   CHART_VERSION     the version to take from an OCI reference (default: the newest)
#   VALUES            your values file (default: none; the chart then refuses its
#                     placeholder image)
#   IMAGE_REPOSITORY  the image's repository (default: the values file's)
#   IMAGE_DIGEST      sha256:... pins the image; IMAGE_TAG then only labels it
#   IMAGE_TAG         the image's tag (default: the values file's, else the chart's appVersion)
#   NAMESPACE, RELEASE, TIMEOUT: see lib.sh (kube-system, ca-asg-provider, 5m)
#   Arguments are passed on to helm (for example --set key=value).
# Leaves behind: the Helm release RELEASE in NAMESPACE (Deployment, ServiceAccount,
# RBAC, ConfigMap, PodDisruptionBudget, ...), its pods Ready. Safe to run again: helm
# upgrade --install leaves a release that already has these inputs as it is.
# On timeout: exit 1 after the release's pods and their Warning Events (where the
# service says why it is not Ready).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

helm_chart_args
step "helm upgrade --install $RELEASE from $CHART (helm $HELM_MAJOR: waits up to $TIMEOUT for Ready pods)"
if ! helm upgrade --install "${HELM_ARGS[@]}" "$@"; then
    explain_not_ready
    fail "the release is not Ready after $TIMEOUT: the Warning Events above say why (NotReady: the service's cause)"
fi

step "the release's pods"
kc get pods -o wide -l "app.kubernetes.io/instance=$RELEASE"
step "done: release $RELEASE in $NAMESPACE is installed and Ready (verify.sh checks it further)"
