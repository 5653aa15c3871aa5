#!/usr/bin/env bash
# Runs every test. Installs what the tests need (moto in a local Python venv) when it
# is missing; the tests start and stop their own servers.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ]; then
    echo "== installing moto[server] into .venv"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check 'moto[server]>=5.0,<6'
fi
export MOTO_SERVER="$PWD/.venv/bin/moto_server"

# One cargo invocation: the SDK's test-util feature (for aws-smithy-mocks) would
# otherwise make a separate `cargo build` compile the SDK twice.
cargo test --locked "$@"
