#!/usr/bin/env bash
# Runs every test. Installs what the tests need when it is missing: moto, PyYAML and
# kubernetes-validate in a local Python venv; kubectl (for kustomize) is expected. The
# tests start and stop their own servers.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if [ ! -x .venv/bin/moto_server ] || ! .venv/bin/python -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    echo "== installing moto[server], kubernetes-validate, PyYAML into .venv"
    .venv/bin/pip install --quiet --disable-pip-version-check \
        'moto[server]>=5.0,<6' 'kubernetes-validate>=1.30' 'PyYAML>=6'
fi
# The overlays need kustomize v4+ (kubectl 1.21+). Debian 12's kubernetes-client is
# 1.20, whose built-in kustomize cannot render them, so there is no package to fall
# back on: say so plainly.
if ! kubectl kustomize --help >/dev/null 2>&1; then
    echo "error: kubectl 1.21+ (for 'kubectl kustomize') is needed by tests/deploy/validate.py" >&2
    exit 1
fi
export MOTO_SERVER="$PWD/.venv/bin/moto_server"

echo "== deploy/: rendered overlays against the Kubernetes schemas (strict)"
.venv/bin/python tests/deploy/validate.py

# One cargo invocation: the SDK's test-util feature (for aws-smithy-mocks) would
# otherwise make a separate `cargo build` compile the SDK twice.
cargo test --locked "$@"
