# shellcheck shell=bash
# Sourced by the quickstart scripts beside it (install.sh, verify.sh, scale-in.sh,
# upgrade.sh, uninstall.sh): their common inputs and functions. Not run on its own.
#
# Common inputs (environment), with their defaults:
#   NAMESPACE  the release's namespace              (kube-system)
#   RELEASE    the Helm release's name               (ca-asg-provider)
#   TIMEOUT    how long a step waits for the cluster (5m)
# kubectl and helm come from PATH, the cluster from kubectl's own configuration
# (KUBECONFIG or ~/.kube/config). Helm 3.8 or later, or Helm 4 (HELM_WAIT: the wait
# flag of the one found).

NAMESPACE=${NAMESPACE:-kube-system}
RELEASE=${RELEASE:-ca-asg-provider}
TIMEOUT=${TIMEOUT:-5m}
QS_SCRIPT=$(basename "$0")
QS_STEP="start"
QS_SAID=""

# What a script undoes on its way out (it redefines this).
qs_cleanup() { :; }
# A failure names the script and the step it stopped in, once.
qs_exit() {
    local rc=$?
    qs_cleanup
    if [ "$rc" -ne 0 ] && [ -z "$QS_SAID" ]; then
        printf '%s: FAILED at step "%s" (exit %s)\n' "$QS_SCRIPT" "$QS_STEP" "$rc" >&2
    fi
}
trap qs_exit EXIT

# step NAME: what the script does next, printed.
step() {
    QS_STEP=$1
    printf '%s: %s\n' "$QS_SCRIPT" "$1"
}

# say TEXT: a line of progress or of a result.
say() {
    printf '  %s\n' "$*"
}

# fail TEXT: stop, naming the script and the step.
fail() {
    printf '%s: FAILED at step "%s": %s\n' "$QS_SCRIPT" "$QS_STEP" "$*" >&2
    QS_SAID=1
    exit 1
}

# need VAR...: refuse to start without each, by name.
need() {
    local v
    for v in "$@"; do
        [ -n "${!v:-}" ] || fail "$v is not set (the header of $QS_SCRIPT says what it is)"
    done
}

# seconds 5m|90s|90: a duration of TIMEOUT's kind in seconds.
seconds() {
    case "$1" in
        *h) echo $((${1%h} * 3600)) ;;
        *m) echo $((${1%m} * 60)) ;;
        *s) echo "${1%s}" ;;
        *) echo "$1" ;;
    esac
}

# helm_version: Helm's major version (3 or 4) in HELM_MAJOR, its wait flag in HELM_WAIT
# (Helm 4 waits with kstatus's watcher, --wait=watcher; Helm 3 has only --wait). Older
# than 3.8 (no OCI charts) is refused in one sentence.
helm_version() {
    local v
    v=$(helm version --template '{{.Version}}' 2>/dev/null) ||
        fail "helm is not on PATH or does not run (install Helm 3.8 or later, or Helm 4: https://helm.sh/docs/intro/install/)"
    HELM_MAJOR=${v#v}
    HELM_MAJOR=${HELM_MAJOR%%.*}
    local minor=${v#v*.}
    minor=${minor%%.*}
    case "$HELM_MAJOR" in
        3) [ "$minor" -ge 8 ] 2>/dev/null ||
            fail "helm $v is older than 3.8, which these scripts need (OCI charts): install Helm 3.8 or later, or Helm 4"
            HELM_WAIT=(--wait) ;;
        4) HELM_WAIT=(--wait=watcher) ;;
        *) fail "helm $v: these scripts run on Helm 3 (3.8 or later) and Helm 4" ;;
    esac
}
helm_version

# The release's revision.
revision() {
    helm status "$RELEASE" --namespace "$NAMESPACE" | sed -n 's/^REVISION: *//p'
}

kc() {
    kubectl --namespace "$NAMESPACE" "$@"
}

# The release's Deployment (standalone or bundled mode), by its chart labels.
deployment() {
    local d
    d=$(kc get deployment -o name \
        -l "app.kubernetes.io/name=ca-asg-provider,app.kubernetes.io/instance=$RELEASE") ||
        fail "kubectl cannot list the Deployments in $NAMESPACE (is kubectl pointed at the cluster?)"
    [ -n "$d" ] || fail "no Deployment of release $RELEASE in namespace $NAMESPACE (installed with install.sh? in sidecar mode the Deployment is cluster-autoscaler's)"
    [ "$(printf '%s\n' "$d" | wc -l)" -eq 1 ] || fail "several Deployments of release $RELEASE: $d"
    printf '%s\n' "${d#*/}"
}

# pod_off NODE: a Ready pod of the release on another node than NODE (so a drain of
# NODE run in it does not end with its own pod), else nothing.
pod_off() {
    kc get pods -l "app.kubernetes.io/name=ca-asg-provider,app.kubernetes.io/instance=$RELEASE" \
        -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.deletionTimestamp}{range .status.conditions[?(@.type=="Ready")]} {.status}{end}{"\n"}{end}' |
        awk -v node="$1" 'NF == 3 && $2 != node && $3 == "True" { print $1; exit }'
}

# The release's pods, by name, one a line.
release_pods() {
    kc get pods -o name -l "app.kubernetes.io/name=ca-asg-provider,app.kubernetes.io/instance=$RELEASE" \
        | sed 's|^pod/||'
}

# Where the cause of a pod that is not Ready is: the release's pods and their Warning
# Events (the service writes a NotReady Event with the cause, 30 s after it starts).
explain_not_ready() {
    local p
    echo "The release's pods:" >&2
    kc get pods -o wide -l "app.kubernetes.io/instance=$RELEASE" >&2 || true
    for p in $(release_pods); do
        echo "Warning Events of pod $p (kubectl -n $NAMESPACE describe pod $p shows all):" >&2
        kc get events --field-selector "involvedObject.kind=Pod,involvedObject.name=$p,type=Warning" \
            -o custom-columns=REASON:.reason,COUNT:.count,MESSAGE:.message >&2 || true
    done
}

# The arguments of helm install/upgrade from the inputs of install.sh and upgrade.sh, in
# the array HELM_ARGS.
helm_chart_args() {
    need CHART
    HELM_ARGS=("$RELEASE" "$CHART" --namespace "$NAMESPACE" "${HELM_WAIT[@]}" --timeout "$TIMEOUT")
    if [ -n "${CHART_VERSION:-}" ]; then HELM_ARGS+=(--version "$CHART_VERSION"); fi
    if [ -n "${VALUES:-}" ]; then
        [ -r "$VALUES" ] || fail "VALUES=$VALUES: no such file"
        HELM_ARGS+=(--values "$VALUES")
    fi
    if [ -n "${IMAGE_REPOSITORY:-}" ]; then HELM_ARGS+=(--set-string "image.repository=$IMAGE_REPOSITORY"); fi
    if [ -n "${IMAGE_DIGEST:-}" ]; then
        [[ $IMAGE_DIGEST =~ ^sha256:[0-9a-f]{64}$ ]] ||
            fail "IMAGE_DIGEST=$IMAGE_DIGEST: expected sha256: and 64 lowercase hex digits"
        HELM_ARGS+=(--set-string "image.digest=$IMAGE_DIGEST")
    fi
    if [ -n "${IMAGE_TAG:-}" ]; then HELM_ARGS+=(--set-string "image.tag=$IMAGE_TAG"); fi
}
