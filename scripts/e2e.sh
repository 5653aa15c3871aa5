#!/usr/bin/env bash
# The end-to-end suite on a real control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler built from the Go module proxy, cached outside
# the source tree by scripts/e2e/build.sh), the service as its shipped ServiceAccount,
# nodes played by the suite's fake kubelet (tests/e2e/kubelet.rs).
#
#   scripts/e2e.sh                 every scenario on the newest Kubernetes ($K8S_DEFAULT)
#   scripts/e2e.sh --matrix        every scenario on every Kubernetes version of the matrix,
#                                  then the compatibility table (Markdown) on stdout
#   scripts/e2e.sh -- FILTER       only the scenarios whose test name contains FILTER
#                                  (a CA profile: -- ca_1_36::; the real-CA tier: -- real_ca)
#   scripts/e2e.sh storm N[,N...]  the drain storm (tests/e2e_storm.rs) of N nodes on the
#                                  real control plane, ended by the service and then by
#                                  `kubectl drain` per node; figures side by side on stdout
#                                  and as JSON lines in target/storm.jsonl (not in .ci/run)
#   scripts/e2e.sh watch N[,N...]  the service's memory with N Nodes (and a pod on each)
#                                  watched through the real API server
#   E2E_STORM_DRAINING=K scripts/e2e.sh storm N
#                                  only K of the N nodes end (the cluster stays N): the
#                                  service's memory against the number of draining nodes
#   E2E_STORM_DRAINERS=service,queue,kubectl,ca
#                                  which drainers end the storm (default: service,
#                                  kubectl, and ca when E2E_CA_BINS is set); queue: the
#                                  service in queue mode; ca: the newest CA of
#                                  E2E_CA_BINS deciding and draining by itself, every
#                                  flag of its drain at its default
#   E2E_STORM_CA_FLAGS="--max-drain-parallelism=10"
#                                  flags added to that CA's
#   E2E_STORM_API_QPS=Q            the service's apiQps (burst 2Q) instead of the shipped 50
#   E2E_STORM_LIMIT_S=S            each storm cut S s after the decision (default: a
#                                  bound of its own; CA's 600 s + 60 s per node). A cut
#                                  storm records what it measured ("cut": true, the
#                                  instances ended and when), then fails
#
# Every scenario where cluster-autoscaler decides runs once per CA profile (1.31, 1.34,
# 1.36, master), driven by the suite's client playing that version. With
# E2E_CA_BINS=DIR (a directory of cluster-autoscaler-<version> binaries copied out of the
# official images) the same scenarios also run with each real binary as the driver
# (tests/e2e/real_ca_scenarios.rs); without it that tier prints one line saying it was
# skipped and why; E2E_REAL_CA_SCENARIO=TEXT runs only the scenarios whose name holds TEXT.
# The same binaries, made into images at test time, run in the chart's bundled pod
# (tests/e2e_install.rs), and with E2E_CA_CHART=DIR (CA's own chart cluster-autoscaler)
# in CA's pod beside the provider as a sidecar.
#
# A failure names the scenario, the driver (CA profile or binary), the Kubernetes version
# and the step. Exits non-zero if any scenario failed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/e2e/versions.sh

# The storm and the watch are measurements, not scenarios: run alone, on the newest
# Kubernetes, one control plane at a time, with the service built as it ships (release;
# the first build takes about 15 minutes on 2 cores).
if [ "${1:-}" = storm ] || [ "${1:-}" = watch ]; then
    what="$1" sizes="${2:?usage: scripts/e2e.sh $1 N[,N...]}"
    cargo test --locked --release --test e2e_storm --no-run
    bins="$(scripts/e2e/build.sh "$K8S_DEFAULT" | tail -n 2)"
    etcd_dir="$(echo "$bins" | head -n 1)"
    k8s_dir="$(echo "$bins" | tail -n 1)"
    if [ "$what" = storm ]; then
        var=E2E_STORM test=drain_storm_on_the_real_api_server
    else
        var=E2E_STORM_WATCH test=service_memory_with_thousands_of_nodes_watched
    fi
    mkdir -p target
    exec env E2E_K8S_BIN="$k8s_dir" E2E_ETCD="$etcd_dir/etcd" E2E_K8S_VERSION="$K8S_DEFAULT" \
        E2E_REQUIRED=1 "$var=$sizes" E2E_STORM_JSON="${E2E_STORM_JSON:-$PWD/target/storm.jsonl}" \
        cargo test --locked --release --test e2e_storm "$test" -- --nocapture --test-threads=1
fi

matrix=0
filter=()
while [ $# -gt 0 ]; do
    case "$1" in
        --matrix) matrix=1 ;;
        --) shift; filter=("$@"); break ;;
        *) echo "usage: scripts/e2e.sh [--matrix] [-- FILTER]" >&2; exit 2 ;;
    esac
    shift
done

versions=("$K8S_DEFAULT")
[ "$matrix" = 1 ] && versions=("${K8S_MATRIX[@]}")

results="$(mktemp -t ca-asg-e2e-results.XXXXXX)"
trap 'rm -f "$results"' EXIT

# Build the test binary once (not timed against any version).
cargo test --locked --test e2e_real --test e2e_logs --test e2e_ca_rbac --test e2e_install --no-run

images="$(scripts/e2e/node-deps.sh)"
export E2E_CA_BINS="${E2E_CA_BINS:-}"
if [ -n "$E2E_CA_BINS" ]; then
    echo "== e2e: real-CA tier with the binaries of $E2E_CA_BINS"
fi
tier_start=$(date +%s)
failed=0
for v in "${versions[@]}"; do
    start=$(date +%s)
    bins="$(scripts/e2e/build.sh "$v" | tail -n 2)"
    etcd_dir="$(echo "$bins" | head -n 1)"
    k8s_dir="$(echo "$bins" | tail -n 1)"
    echo "== e2e: upstream parts for Kubernetes $v ready in $(( $(date +%s) - start )) s ($k8s_dir)"
    start=$(date +%s)
    if ! E2E_K8S_BIN="$k8s_dir" E2E_ETCD="$etcd_dir/etcd" E2E_K8S_VERSION="$v" \
        E2E_IMAGES="$images" E2E_RESULTS="$results" E2E_REQUIRED=1 \
        cargo test --locked --test e2e_real --test e2e_logs --test e2e_ca_rbac --test e2e_install -- "${filter[@]}"; then
        failed=1
    fi
    echo "== e2e: scenarios on Kubernetes $v took $(( $(date +%s) - start )) s"
done
echo "== e2e: the whole tier took $(( $(date +%s) - tier_start )) s"

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def took(r):
    t = r.get("scale_in_secs")
    return f"{t:.1f} s" if t is not None else "-"
def result(r):
    return r["result"] + (f" (step: {r['step']})" if r.get("step") else "")
def wall(r):
    t = r.get("wall_secs")
    return f"{t:.0f} s" if t is not None else "-"
print()
print("| scenario | driver | Kubernetes | result | scale-in to instance end | wall time |")
print("|---|---|---|---|---|---|")
for r in rows:
    if "lines_lost" not in r:
        print(f"| {r['scenario']} | {r['driver']} | {r['kubernetes']} | {result(r)} | {took(r)} | {wall(r)} |")
logs = [r for r in rows if "lines_lost" in r]
if logs:
    print()
    print("| way the node ends (real kubelet, containerd) | Kubernetes | lines written | lines lost | scale-in to instance end | result |")
    print("|---|---|---|---|---|---|")
    for r in logs:
        name = r["scenario"].removeprefix("lost logs: ")
        print(f"| {name} | {r['kubernetes']} | {r['lines_written']} | {r['lines_lost']} | {took(r)} | {result(r)} |")
PY
exit "$failed"
