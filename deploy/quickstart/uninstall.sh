#!/usr/bin/env bash
# Uninstalls the release: helm uninstall, whose post-delete Job removes the lifecycle
# hooks the service created (so no scale-in waits for a hook nobody answers), then checks
# that nothing of the service is left in the cluster (its objects, RBAC and Lease) and
# says so.
#
# Inputs (environment):
#   LEASE      the leader-election Lease (default ca-asg-provider: config.scaleIn.leaseName)
#   NAMESPACE, RELEASE, TIMEOUT: see lib.sh (kube-system, ca-asg-provider, 5m)
# Leaves behind: nothing of the service in the cluster. What is yours stays: Secrets you
# made (TLS), the IAM role and policy, the groups' tags (docs/helm.md, Uninstall).
# Safe to run again: without the release it only checks.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
LEASE=${LEASE:-ca-asg-provider}
labels="app.kubernetes.io/instance=$RELEASE"

step "helm uninstall $RELEASE (its post-delete Job removes the service's lifecycle hooks)"
if helm status "$RELEASE" --namespace "$NAMESPACE" >/dev/null 2>&1; then
    job=$(kc get deployment -o name -l "app.kubernetes.io/name=ca-asg-provider,$labels" | sed 's|^deployment.apps/||; s|$|-remove-hooks|')
    if ! helm uninstall "$RELEASE" --namespace "$NAMESPACE" --wait=watcher --timeout "$TIMEOUT"; then
        fail "helm uninstall failed; if it names the Job ${job:-<release>-remove-hooks}, its log says which hook it could not remove and what to check: kubectl -n $NAMESPACE logs job/${job:-<release>-remove-hooks}"
    fi
    say "the post-delete Job ${job:-} succeeded: no lifecycle hook of the service is left on its groups"
else
    say "no release $RELEASE in $NAMESPACE (uninstalled already): checking what is left"
fi

step "helm test's Pods (helm keeps them for their log and leaves them at uninstall)"
tests=$(kc get pods -l "$labels" \
    -o jsonpath='{range .items[?(@.metadata.annotations.helm\.sh/hook=="test")]}{.metadata.name}{"\n"}{end}')
if [ -n "$tests" ]; then
    # shellcheck disable=SC2086 # one name a line
    kc delete pod $tests --wait=true
else
    say "none"
fi

step "no object of the release is left (pods, RBAC, ConfigMaps, Jobs, ...)"
kinds=deployment,replicaset,pod,service,configmap,serviceaccount,role,rolebinding,poddisruptionbudget,job
left=""
for _ in $(seq 60); do
    left=$(kc get "$kinds" -l "$labels" -o name; kubectl get clusterrole,clusterrolebinding -l "$labels" -o name)
    [ -z "$left" ] && break
    sleep 2
done
[ -z "$left" ] || fail "still there after 120 s: $(echo "$left" | tr '\n' ' ')"
say "none of: $kinds, clusterrole, clusterrolebinding labelled $labels"

step "the Lease $LEASE (the service writes it; helm does not know it)"
if kc get lease "$LEASE" >/dev/null 2>&1; then
    kc delete lease "$LEASE"
    say "deleted: no replica of the release is left to hold it"
else
    say "none"
fi

step "done: nothing of release $RELEASE is left in namespace $NAMESPACE or cluster-wide"
