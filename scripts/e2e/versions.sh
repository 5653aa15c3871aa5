# Versions of the upstream parts the end-to-end suite builds (sourced by the e2e scripts).
# What the Go module proxy served on 2026-11-24 (see docs/e2e.md):
#   k8s.io/kubernetes: v1.34.0 v1.34.2 v1.34.3 v1.34.4 v1.35.4 v1.36.1 v1.36.3 v1.37.2
#   go.etcd.io/etcd/server/v3: ... v3.6.16, v3.7.0 .. v3.7.3
#   k8s.io/autoscaler/cluster-autoscaler: nothing (403 for the list, every release tag's
#   commit and its pseudo-version)
K8S_DEFAULT="${E2E_K8S_VERSION:-v1.37.2}"
# Every Kubernetes version the matrix runs: the newest patch of 1.37, and the oldest minor
# EKS users still run that the proxy serves.
K8S_MATRIX=(v1.37.2 v1.34.4)
ETCD_VERSION="${E2E_ETCD_VERSION:-v3.6.16}"

e2e_cache() {
    echo "${CA_ASG_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ca-asg-provider/e2e}"
}
