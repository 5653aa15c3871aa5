# shellcheck shell=bash
# Sourced by the quickstart scripts beside it (install.sh, verify.sh, scale-in.sh,
# upgrade.sh, uninstall.sh): their common inputs and functions. Not run on its own.
#
# Common inputs (environment), with their defaults:
#   NAMESPACE  the release's namespace              (kube-system)
#   RELEASE    the Helm release's name               (ca-asg-provider)
#   TIMEOUT    how long a step waits for the cluster (5m)
# kubectl and helm come from PATH, the cluster from kubectl's own configuration
# (KUBECONFIG or ~/.kube/config).

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
    HELM_ARGS=("$RELEASE" "$CHART" --namespace "$NAMESPACE" --wait=watcher --timeout "$TIMEOUT")
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
