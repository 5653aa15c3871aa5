#!/usr/bin/env bash
# One scale-in end to end, as an operator can run it on a real cluster: the service's
# own drain of one node (`ca-asg-provider drain NODE --terminate`, run in a pod of the
# release on another node, under its ServiceAccount and IAM role, so the drain does not
# evict the pod it runs in), which cordons the node, evicts the
# workload pods first (through the Eviction API: PodDisruptionBudgets hold), the DaemonSet
# pods last, then ends the instance as CA's scale-in does (the lifecycle hook's action
# completed when the group has the service's hook, else the instance terminated and its
# group's desired capacity lowered by one); then waits until the Node is gone.
#
# Inputs (environment):
#   NODE       required: the Node to scale in (a node of a group the service manages)
#   CONFIG     the config file in the pod (default: the chart's, which the pod's
#              CA_ASG_PROVIDER_CONFIG names)
#   NAMESPACE, RELEASE, TIMEOUT: see lib.sh (kube-system, ca-asg-provider, 5m: how long
#              the Node may take to go once its instance ended)
# Leaves behind: the node's pods rescheduled elsewhere, its instance ended, its group one
# instance smaller. The drain prints a line per phase, and every 10 s the pods and
# budgets that keep it waiting. Safe to run again: a Node already gone is said so, exit 0.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need NODE
CONFIG=${CONFIG:-}

step "the node $NODE"
if ! kubectl get node "$NODE" >/dev/null 2>&1; then
    say "node $NODE is not in the cluster (gone already): nothing to do"
    step "done"
    exit 0
fi
say "instance: $(kubectl get node "$NODE" -o jsonpath='{.spec.providerID}')"
kubectl get pods --all-namespaces --field-selector "spec.nodeName=$NODE" \
    -o custom-columns=NAMESPACE:.metadata.namespace,POD:.metadata.name,OWNER:.metadata.ownerReferences[0].kind

step "a Ready pod of the release on another node than $NODE"
DEPLOY=$(deployment)
POD=$(pod_off "$NODE")
[ -n "$POD" ] || fail "every Ready pod of release $RELEASE runs on $NODE (or none is Ready): the drain would evict the pod it runs in; run two replicas, or keep them off the groups this service scales in (nodeSelector, the quickstart's values)"
say "$POD (on $(kc get pod "$POD" -o jsonpath='{.spec.nodeName}'))"

step "drain $NODE and end its instance (ca-asg-provider drain --terminate, in $POD)"
kc exec "$POD" -c ca-asg-provider -- \
    ca-asg-provider drain "$NODE" --terminate ${CONFIG:+-c "$CONFIG"}

step "wait until the Node $NODE is gone (up to $TIMEOUT)"
start=$SECONDS
limit=$(seconds "$TIMEOUT")
while kubectl get node "$NODE" >/dev/null 2>&1; do
    [ $((SECONDS - start)) -lt "$limit" ] ||
        fail "node $NODE is still there $TIMEOUT after its instance ended (the cloud's node controller deletes it; kubectl describe node $NODE)"
    say "$((SECONDS - start)) s: node $NODE still there"
    sleep 5
done
say "$((SECONDS - start)) s: node $NODE is gone"

step "done: $NODE drained, its instance ended and its Node gone"
