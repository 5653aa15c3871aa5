#!/usr/bin/env bash
# Upgrades the release with changed values (a new chart version, image or setting) and
# checks that no moment of the rollout left zero Ready replicas: every change of the
# Deployment's status is watched while helm upgrades and waits.
#
# Inputs (environment): those of install.sh (CHART required; VALUES, CHART_VERSION,
# IMAGE_REPOSITORY, IMAGE_DIGEST, IMAGE_TAG), NAMESPACE, RELEASE, TIMEOUT (lib.sh).
# Give the whole values file again, with your change in it or as arguments (passed on to
# helm, for example --set logLevel=debug): helm upgrade replaces the release's values.
# Leaves behind: the release at the new values, its pods Ready; exit 1 if the release
# was not Ready within TIMEOUT or the Deployment had no Ready replica at some moment of
# the rollout. Safe to run again (an upgrade to the same values changes nothing).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

helm_chart_args
step "the release before"
helm status "$RELEASE" --namespace "$NAMESPACE" >/dev/null ||
    fail "no release $RELEASE in $NAMESPACE: install it first (install.sh)"
DEPLOY=$(deployment)
say "revision $(revision)"

step "watch deployment/$DEPLOY's Ready replicas through the upgrade"
watch_log=$(mktemp)
kc get deployment "$DEPLOY" --watch -o jsonpath='{.status.readyReplicas}{" ready, "}{.status.updatedReplicas}{" updated, "}{.status.replicas}{" in all\n"}' \
    >"$watch_log" 2>&1 &
watcher=$!
qs_cleanup() { kill "$watcher" 2>/dev/null || true; rm -f "$watch_log"; }
for _ in $(seq 50); do [ -s "$watch_log" ] && break; sleep 0.2; done
[ -s "$watch_log" ] || fail "kubectl get --watch printed nothing: $(cat "$watch_log")"

step "helm upgrade $RELEASE (helm $HELM_MAJOR: waits up to $TIMEOUT for Ready pods)"
if ! helm upgrade "${HELM_ARGS[@]}" "$@"; then
    explain_not_ready
    fail "the release is not Ready after $TIMEOUT: the Warning Events above say why"
fi
kc rollout status "deployment/$DEPLOY" --timeout="$TIMEOUT"
sleep 2 # the watch's last lines
kill "$watcher" 2>/dev/null || true

step "no moment without a Ready replica"
sed 's/^/  /' "$watch_log"
# readyReplicas is absent (an empty field) when it is 0.
fewest=$(awk '/ ready, / { n = ($1 == "ready,") ? 0 : $1 + 0; if (min == "" || n < min) min = n } END { print min }' "$watch_log")
[ -n "$fewest" ] || fail "the watch saw no status of deployment/$DEPLOY"
[ "$fewest" -ge 1 ] || fail "deployment/$DEPLOY had $fewest Ready replicas at one moment of the rollout"
say "never fewer than $fewest Ready replica(s) over $(grep -c ' ready, ' "$watch_log") status changes"
step "done: release $RELEASE upgraded (revision $(revision)), $DEPLOY rolled out"
