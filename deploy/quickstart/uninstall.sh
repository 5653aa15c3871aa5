#!/usr/bin/env bash
# Uninstalls the release: stops its replicas (no drain goes on, none starts), then helm
# uninstall, whose post-delete Job gives back every node still carrying this service's
# marks (`ca-asg-provider undrain --all --force`: its taint, drain record and own cordon)
# and removes the lifecycle hooks the service created (so no scale-in waits for a hook
# nobody answers); then deletes the Leases (and in bundled mode CA's status ConfigMap),
# which helm does not know, and checks that nothing of the service is left in the cluster
# (its objects, RBAC, Leases, a mark on any Node) and says so.
#
# Inputs (environment):
#   LEASE      the leader-election Lease (default ca-asg-provider: config.scaleIn.leaseName)
#   NAMESPACE, RELEASE, TIMEOUT: see lib.sh (kube-system, ca-asg-provider, 5m)
# Leaves behind: nothing of the service in the cluster. What is yours stays: Secrets you
# made (TLS), the IAM role and policy, the groups' tags (docs/helm.md, Uninstall); a
# cordon that is not this service's (an operator's, CA's taint while CA is gone).
# Safe to run again: without the release it only checks.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
LEASE=${LEASE:-ca-asg-provider}
labels="app.kubernetes.io/instance=$RELEASE"

# Bundled mode: CA's Lease and status ConfigMap, by its flags (CA's defaults otherwise).
ca_lease="" ca_status=""
step "stop the release's replicas (no drain goes on or starts while the nodes are given back)"
if helm status "$RELEASE" --namespace "$NAMESPACE" >/dev/null 2>&1; then
    DEPLOY=$(kc get deployment -o name -l "app.kubernetes.io/name=ca-asg-provider,$labels" | sed 's|^deployment.apps/||')
    if [ -n "$DEPLOY" ]; then
        flags=$(kc get deployment "$DEPLOY" -o jsonpath='{range .spec.template.spec.containers[?(@.name=="cluster-autoscaler")]}{range .command[*]}{@}{"\n"}{end}{range .args[*]}{@}{"\n"}{end}{end}')
        if kc get deployment "$DEPLOY" -o jsonpath='{.spec.template.spec.containers[*].name}' | grep -qw cluster-autoscaler; then
            ca_lease=$(printf '%s\n' "$flags" | sed -n 's/^--leader-elect-resource-name=//p' | tail -n 1)
            ca_lease=${ca_lease:-cluster-autoscaler}
            ca_status=$(printf '%s\n' "$flags" | sed -n 's/^--status-config-map-name=//p' | tail -n 1)
            ca_status=${ca_status:-cluster-autoscaler-status}
        fi
        kc scale deployment "$DEPLOY" --replicas=0
        kc wait --for=delete pod -l "app.kubernetes.io/name=ca-asg-provider,$labels" --timeout="$TIMEOUT" ||
            fail "the release's pods are still there after $TIMEOUT (kubectl -n $NAMESPACE get pods -l $labels)"
        say "deployment/$DEPLOY: 0 replicas, no pod left"
    else
        say "no Deployment of the release (sidecar mode: CA's chart runs the provider; uninstall CA's release first)"
    fi
else
    say "no release $RELEASE in $NAMESPACE"
fi

step "helm uninstall $RELEASE (its post-delete Job gives back marked nodes, then removes the service's lifecycle hooks)"
if helm status "$RELEASE" --namespace "$NAMESPACE" >/dev/null 2>&1; then
    job=${DEPLOY:+$DEPLOY-remove-hooks}
    if ! helm uninstall "$RELEASE" --namespace "$NAMESPACE" "${HELM_WAIT[@]}" --timeout "$TIMEOUT"; then
        fail "helm uninstall failed; if it names the Job ${job:-<release>-remove-hooks}, its log says which hook it could not remove and what to check: kubectl -n $NAMESPACE logs job/${job:-<release>-remove-hooks}"
    fi
    say "the post-delete Job ${job:-} succeeded: no node keeps the service's marks, no lifecycle hook of the service is left on its groups"
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

step "the Lease $LEASE${ca_lease:+, cluster-autoscaler Lease $ca_lease and status ConfigMap $ca_status} (written by the pods; helm does not know them)"
for obj in "lease/$LEASE" ${ca_lease:+"lease/$ca_lease"} ${ca_status:+"configmap/$ca_status"}; do
    if kc get "$obj" >/dev/null 2>&1; then
        kc delete "$obj"
        say "$obj deleted: no replica of the release is left to hold or write it"
    else
        say "$obj: none"
    fi
done

step "no Node carries a mark of the service (a taint, annotation or label ca-asg-provider.io/...)"
# One line "NODE KEY" per mark: a taint, annotation or label whose key is ca-asg-provider.io/...
# shellcheck disable=SC2016 # a Go template, not shell
marks=$(kubectl get nodes -o go-template='{{range .items}}{{$n := .metadata.name}}{{range .spec.taints}}{{if eq (printf "%.19s" .key) "ca-asg-provider.io/"}}{{$n}} taint {{.key}}{{"\n"}}{{end}}{{end}}{{range $k, $v := .metadata.annotations}}{{if eq (printf "%.19s" $k) "ca-asg-provider.io/"}}{{$n}} annotation {{$k}}{{"\n"}}{{end}}{{end}}{{range $k, $v := .metadata.labels}}{{if eq (printf "%.19s" $k) "ca-asg-provider.io/"}}{{$n}} label {{$k}}{{"\n"}}{{end}}{{end}}{{end}}')
if [ -n "$marks" ]; then
    printf '%s\n' "$marks" | sed 's/^/  /'
    names=$(printf '%s\n' "$marks" | awk '{ print $1 }' | sort -u | tr '\n' ' ')
    fail "still marked (above): $names- give each back with: kubectl -n $NAMESPACE exec deploy/<a replica> -- ca-asg-provider undrain NODE --force; or kubectl uncordon NODE and kubectl taint node NODE ca-asg-provider.io/draining-"
fi
say "none of $(kubectl get nodes -o name | wc -l) nodes"

step "done: nothing of release $RELEASE is left in namespace $NAMESPACE or cluster-wide"
