#!/usr/bin/env bash
# The soak (issue 75; docs/e2e.md#the-soak): two replicas of the service on the real
# control plane under a seeded driver of actions and faults, then judged from outside by
# scripts/soak_check.py. Usage: scripts/soak.sh [--seed S] [--minutes M] [--dir D]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/e2e/versions.sh
seed="" minutes=5 dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --seed) seed="$2"; shift ;;
        --minutes) minutes="$2"; shift ;;
        --dir) dir="$2"; shift ;;
        *) echo "usage: scripts/soak.sh [--seed S] [--minutes M] [--dir D]" >&2; exit 2 ;;
    esac
    shift
done
# The interruption queue is SQS on moto: scripts/test.sh installs it into .venv.
if [ -z "${MOTO_SERVER:-}" ] && [ ! -x .venv/bin/moto_server ] && ! command -v moto_server >/dev/null; then
    echo "soak: no moto_server: scripts/test.sh installs moto into .venv (E2E=0 scripts/test.sh is enough)" >&2
    exit 2
fi
bins="$(scripts/e2e/build.sh "$K8S_DEFAULT" | tail -n 2)"
etcd_dir="$(echo "$bins" | head -n 1)"
k8s_dir="$(echo "$bins" | tail -n 1)"
exec env E2E_K8S_BIN="$k8s_dir" E2E_ETCD="$etcd_dir/etcd" E2E_K8S_VERSION="$K8S_DEFAULT" \
    E2E_REQUIRED=1 SOAK_MINUTES="$minutes" ${seed:+SOAK_SEED="$seed"} ${dir:+SOAK_DIR="$dir"} \
    cargo test --locked --test e2e_soak -- --nocapture --test-threads=1
