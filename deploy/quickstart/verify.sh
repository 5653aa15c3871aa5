#!/usr/bin/env bash
# Checks an installed release the way an operator does in its first minutes: the
# rollout finished, every replica Ready, one replica holding the Lease, helm test, and
# check-config run in a pod of the release (what the service sees of AWS and the cluster).
#
# Inputs (environment):
#   LEASE      the leader-election Lease (default ca-asg-provider: config.scaleIn.leaseName)
#   CONFIG     the config file in the pod (default /etc/ca-asg-provider/config/config.yaml,
#              where the chart mounts it)
#   NAMESPACE, RELEASE, TIMEOUT: see lib.sh (kube-system, ca-asg-provider, 5m)
# Leaves behind: nothing (helm test's pod is deleted by the next helm test). Exit 0 when
# every check passes, 1 naming the one that did not. Safe to run again.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
LEASE=${LEASE:-ca-asg-provider}
CONFIG=${CONFIG:-/etc/ca-asg-provider/config/config.yaml}

step "rollout status"
DEPLOY=$(deployment)
kc rollout status "deployment/$DEPLOY" --timeout="$TIMEOUT"

step "every replica Ready"
want=$(kc get deployment "$DEPLOY" -o jsonpath='{.spec.replicas}')
ready=$(kc get deployment "$DEPLOY" -o jsonpath='{.status.readyReplicas}')
say "$DEPLOY: ${ready:-0} of $want replicas Ready"
[ "${ready:-0}" -eq "$want" ] || { explain_not_ready; fail "${ready:-0} of $want replicas Ready"; }
kc get pods -o wide -l "app.kubernetes.io/name=ca-asg-provider,app.kubernetes.io/instance=$RELEASE"

step "one replica holds the Lease $LEASE"
holder=""
for _ in $(seq 60); do
    holder=$(kc get lease "$LEASE" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
    [ -n "$holder" ] && break
    sleep 1
done
[ -n "$holder" ] || fail "no replica holds the Lease $LEASE after 60 s (each pod's log says why)"
release_pods | grep -x "$holder" >/dev/null ||
    fail "the Lease $LEASE is held by $holder, which is not a pod of release $RELEASE"
say "held by $holder"

step "helm test (check-config in a pod under the release's ServiceAccount)"
helm test "$RELEASE" --namespace "$NAMESPACE" --timeout "$TIMEOUT"

step "check-config in the provider's container of deployment/$DEPLOY"
kc exec "deployment/$DEPLOY" -c ca-asg-provider -- ca-asg-provider check-config -c "$CONFIG"

step "done: release $RELEASE is rolled out, $want of $want Ready, the Lease held by $holder, check-config passed"
