#!/usr/bin/env bash
# The release pipeline (docs/release.md): one script, run by CI here against a registry on
# loopback (tests/e2e_release.rs) and by the public pipeline (.github/workflows/release.yml)
# against a real one.
#   1. the binary for each architecture, cross-compiled (no emulation), reproducibly:
#      `--locked`, SOURCE_DATE_EPOCH = the commit's time, the checkout's and cargo home's
#      paths remapped, its own target dir (target/release-pipeline);
#   2. an image per architecture (scripts/image.sh), pushed, then one multi-arch OCI index
#      (crane);
#   3. SBOMs (scripts/sbom.py, SPDX 2.3 JSON): the crate's (every crate, version, licence,
#      Cargo.lock's checksum) and each image's (its pinned Debian packages, the binary),
#      attached to each architecture's image as a signed cosign attestation;
#   4. the index signed with cosign (recursively: each architecture's manifest too);
#   5. the chart packaged with its image pinned to the index by digest, pushed as an OCI
#      artifact (helm push);
#   6. a machine-readable result (every reference and digest) written to --result.
#
#   scripts/release.sh --registry ghcr.io/acme --keyless                  (the public pipeline)
#   scripts/release.sh --registry 127.0.0.1:5000/t --plain-http --key cosign.key --allow-dirty
#   RELEASE_PROFILE=dev scripts/release.sh --binary amd64=target/debug/ca-asg-provider ...
# Options:
#   --registry PREFIX   where to push ($REGISTRY): PREFIX/ca-asg-provider, oci://PREFIX/charts
#   --key FILE          sign with this cosign key (COSIGN_PASSWORD for its password), offline:
#                       nothing is uploaded to a transparency log
#   --keyless           sign with the CI's OIDC identity (Fulcio certificate, Rekor entry)
#   --arch LIST         amd64,arm64 (default; $RELEASE_ARCHES)
#   --profile NAME      cargo profile, release (default; $RELEASE_PROFILE); dev is CI's cheaper build
#   --binary ARCH=PATH  use this binary for ARCH instead of building it
#   --tag TAG           the image tag (default: Cargo's version and the revision,
#                       0.1.0-<12 hex digits>[-dirty]); a tag the registry holds already is
#                       refused, never pushed over: each build has its own
#   --plain-http        the registry speaks HTTP (a test registry on loopback)
#   --allow-dirty       release a tree with uncommitted changes (its revision says -dirty)
#   --result FILE       the result (default: target/release-pipeline/result.json)
#   --tools             only build (or find) crane and cosign, print their paths, stop: needs
#                       go only (tests/e2e_release.rs serves its registry with `crane registry serve`)
# Needs: cargo and rustup, git, python3, curl; Debian's cross gcc for arm64, umoci and skopeo
# (installed when missing with apt-get, through sudo when not run as root: the only step
# that needs root), go (builds crane and cosign into the cache), helm ($HELM,
# .venv/bin/helm, or on PATH). Run it as yourself, not under sudo (sudo resets PATH, so
# rustup's and Go's commands are not found, and HOME's cache and logins become root's).
# Linux only (umoci, Debian's cross gcc): on a Mac run it in a Debian container or VM.
# Tools are cached in ${CA_ASG_RELEASE_CACHE:-~/.cache/ca-asg-provider/release}, outside the tree.
set -euo pipefail
cd "$(dirname "$0")/.."

CRANE_MODULE='github.com/google/go-containerregistry/cmd/crane'
CRANE_VERSION='v0.22.1'
COSIGN_MODULE='github.com/sigstore/cosign/v3/cmd/cosign'
COSIGN_VERSION='v3.1.3'

step=''
die() { echo "error: release${step:+ ($step)}: $*" >&2; exit 1; }
say() { echo "== release: $*" >&2; }
begin() { step="$1"; say "$1"; step_started=$(date +%s); }
took() { say "$step: $(($(date +%s) - step_started)) s"; }

registry="${REGISTRY:-}"
key=''
keyless=''
arches="${RELEASE_ARCHES:-amd64,arm64}"
profile="${RELEASE_PROFILE:-release}"
declare -A given_binary=()
tag=''
plain_http=''
allow_dirty=''
result=''
tools_only=''
while [ $# -gt 0 ]; do
    case "$1" in
        --registry) registry="$2"; shift ;;
        --key) key="$2"; shift ;;
        --keyless) keyless=1 ;;
        --arch) arches="$2"; shift ;;
        --profile) profile="$2"; shift ;;
        --binary) given_binary["${2%%=*}"]="${2#*=}"; shift ;;
        --tag) tag="$2"; shift ;;
        --plain-http) plain_http=1 ;;
        --allow-dirty) allow_dirty=1 ;;
        --result) result="$2"; shift ;;
        --tools) tools_only=1 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    esac
    shift
done
if [ -n "$tools_only" ]; then
    registry="${registry:-none}" key="${key:-none}" keyless=''
fi
[ -n "$registry" ] || die "--registry (or REGISTRY) names where to push"
registry="${registry%/}"
if [ -n "$key" ] && [ -n "$keyless" ]; then die "--key or --keyless, not both"; fi
if [ -z "$key" ] && [ -z "$keyless" ]; then die "--key FILE or --keyless: nothing is pushed unsigned"; fi
if [ -n "$key" ] && [ -z "$tools_only" ]; then
    [ -r "$key" ] || die "no cosign key at $key"
    key="$(cd "$(dirname "$key")" && pwd)/$(basename "$key")"
fi
IFS=, read -r -a arch_list <<<"$arches"
for a in "${arch_list[@]}"; do
    case "$a" in amd64 | arm64) ;; *) die "--arch takes amd64 and arm64, not $a" ;; esac
done
for a in "${!given_binary[@]}"; do
    [ -x "${given_binary[$a]}" ] || die "--binary $a=${given_binary[$a]}: no such executable"
done

# The source: a commit, its time, nothing uncommitted (or said so).
revision="$(git rev-parse HEAD)" || die "not a git checkout"
short_revision="$(git rev-parse --short=12 HEAD)"
if [ -z "$tools_only" ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    [ -n "$allow_dirty" ] || die "uncommitted changes in tracked files (commit them, or --allow-dirty: the image's revision then says -dirty)"
    revision="$revision-dirty"
    short_revision="$short_revision-dirty"
fi
# The binary's --version and build_info metric name it (build.rs).
export CA_ASG_PROVIDER_REVISION="$short_revision"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
# Each build its own tag: two commits of one version never share one.
tag="${tag:-$version-$short_revision}"
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "--tag $tag: not an OCI tag (letters, digits, _ . -, at most 128, not starting with . or -)"
repo="$registry/ca-asg-provider"
target_dir="${RELEASE_TARGET_DIR:-$PWD/target/release-pipeline}"
result="${result:-$target_dir/result.json}"
cache="${CA_ASG_RELEASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ca-asg-provider/release}"
out="$target_dir/out"
mkdir -p "$cache"
[ -n "$tools_only" ] || mkdir -p "$out"
started=$(date +%s)

# ---- tools ------------------------------------------------------------------------------
apt_install() {
    command -v apt-get >/dev/null || die "needs $* (Debian and Ubuntu: apt-get install $*; on a Mac run this script in a Debian container or VM)"
    local apt=(apt-get -o DPkg::Lock::Timeout=600)
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "needs $* (as root: apt-get install $*)"
        apt=(sudo DEBIAN_FRONTEND=noninteractive "${apt[@]}")
        say "installing $* from Debian's packages (sudo apt-get: root for this step only)"
    else
        say "installing $* from Debian's packages"
    fi
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "$@" >&2 ||
        { "${apt[@]}" update -qq >&2 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "$@" >&2; } ||
        die "apt-get install $* failed"
}
# A Go command from the module proxy, built once into the cache (GOBIN per version).
go_tool() { # name module version
    local bin="$cache/bin/$1-$3/$1" t
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null || die "go is needed to build $1 $3 from $2 (https://go.dev/dl)"
        say "building $1 $3 (go install $2@$3)"
        t=$(date +%s)
        GOBIN="$(dirname "$bin")" GOFLAGS=-mod=mod CGO_ENABLED=0 \
            GOCACHE="${GOCACHE:-$cache/gocache}" \
            go install -trimpath -ldflags='-s -w' "$2@$3" >&2 || die "go install $2@$3 failed"
        say "built $1 in $(($(date +%s) - t)) s"
    fi
    echo "$bin"
}
begin "tools"
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ]; then
    say "warning: run as root through sudo: the cache and registry logins are root's ($HOME), not $SUDO_USER's; run it as $SUDO_USER (it uses sudo for apt-get only)"
fi
if [ -z "$tools_only" ]; then
    for t in cargo rustup git python3 curl; do
        command -v "$t" >/dev/null || die "$t is needed (not on PATH=$PATH)"
    done
fi
crane="$(go_tool crane "$CRANE_MODULE" "$CRANE_VERSION")"
cosign="$(go_tool cosign "$COSIGN_MODULE" "$COSIGN_VERSION")"
if [ -n "$tools_only" ]; then
    printf '%s\n%s\n' "$crane" "$cosign"
    exit 0
fi
helm="${HELM:-}"
if [ -z "$helm" ]; then
    if [ -x .venv/bin/helm ]; then helm="$PWD/.venv/bin/helm"; else helm="$(command -v helm || true)"; fi
fi
[ -n "$helm" ] || die "helm is needed (scripts/test.sh puts one in .venv/bin, or set HELM)"
command -v skopeo >/dev/null || apt_install skopeo umoci
took

crane_opts=()
skopeo_opts=()
cosign_opts=()
helm_opts=()
if [ -n "$plain_http" ]; then
    crane_opts=(--insecure)
    skopeo_opts=(--dest-tls-verify=false)
    cosign_opts=(--allow-http-registry --allow-insecure-registry)
    helm_opts=(--plain-http)
fi

# ---- each build its own tag -------------------------------------------------------------
# The chart's version carries the revision as SemVer build metadata (0.1.0+<revision>;
# the registry's tag is 0.1.0_<revision>, as helm push writes it), so `helm list` tells
# two builds apart too.
chart_base_version="$(sed -n 's/^version: *//p' deploy/chart/Chart.yaml)"
chart_version="$chart_base_version+${short_revision//[^0-9A-Za-z.-]/-}"
# A tag the registry holds already is never pushed over: an upgrade to a new build must
# change the reference, or nodes keep the image they have.
refuse_existing() { # reference
    local out
    if out="$("$crane" digest "${crane_opts[@]}" "$1" 2>&1)"; then
        die "$1 exists already ($out): each build has its own tag and none is pushed over (commit, or --tag another)"
    fi
    case "$out" in
        *MANIFEST_UNKNOWN* | *NAME_UNKNOWN* | *"not found"* | *"NOT_FOUND"* | *404*) ;;
        *) die "cannot tell whether $1 exists: $out" ;;
    esac
}
begin "tags are new"
refuse_existing "$repo:$tag"
for a in "${arch_list[@]}"; do refuse_existing "$repo:$tag-$a"; done
refuse_existing "$registry/charts/ca-asg-provider:${chart_version//+/_}"
took

# ---- 1. binaries ------------------------------------------------------------------------
triplet() { case "$1" in amd64) echo x86_64-unknown-linux-gnu ;; arm64) echo aarch64-unknown-linux-gnu ;; esac; }
host_arch="$(case "$(uname -m)" in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) uname -m ;; esac)"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
declare -A binary=() built=()
for a in "${arch_list[@]}"; do
    if [ -n "${given_binary[$a]:-}" ]; then
        binary[$a]="${given_binary[$a]}"
        built[$a]="given: ${given_binary[$a]}"
        continue
    fi
    begin "binary $a ($profile)"
    t="$(triplet "$a")"
    env_t="$(echo "$t" | tr 'a-z-' 'A-Z_')"
    rustup target list --installed | grep -qx "$t" || rustup target add "$t" >&2 || die "rustup target add $t failed"
    cross_env=()
    if [ "$a" != "$host_arch" ]; then
        gcc_triplet="${t/-unknown/}"
        if ! command -v "$gcc_triplet-gcc" >/dev/null; then
            case "$a" in
                arm64) apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;;
                amd64) apt_install gcc-x86-64-linux-gnu libc6-dev-amd64-cross ;;
            esac
        fi
        cross_env=("CARGO_TARGET_${env_t}_LINKER=$gcc_triplet-gcc" "CC_${t//-/_}=$gcc_triplet-gcc" "AR_${t//-/_}=$gcc_triplet-ar")
    fi
    # Paths that would end up in the binary (panic locations, aws-lc's C asserts) are
    # the same wherever the checkout and cargo's home are.
    # The target dir (inside the checkout, the more specific prefix) both first and last,
    # so it wins whether the compiler takes the first or the last matching mapping.
    remap="\"--remap-path-prefix=$target_dir=/build/target\", \"--remap-path-prefix=$PWD=/build/ca-asg-provider\", \"--remap-path-prefix=$cargo_home=/cargo\", \"--remap-path-prefix=$target_dir=/build/target\""
    env "${cross_env[@]}" CARGO_TARGET_DIR="$target_dir" \
        "CFLAGS_${t//-/_}=-ffile-prefix-map=$target_dir=/build/target -ffile-prefix-map=$PWD=/build/ca-asg-provider -ffile-prefix-map=$cargo_home=/cargo -ffile-prefix-map=$target_dir=/build/target" \
        cargo build --locked --profile "$profile" --bin ca-asg-provider --target "$t" \
        --config "build.rustflags=[$remap]" >&2 || die "cargo build for $t failed"
    dir="$profile"; [ "$profile" = dev ] && dir=debug
    binary[$a]="$target_dir/$t/$dir/ca-asg-provider"
    built[$a]="cargo --profile $profile --target $t"
    took
done

# ---- 2. images, pushed, and the index ---------------------------------------------------
declare -A image_digest=() image_size=()
for a in "${arch_list[@]}"; do
    begin "image $a"
    archive="$out/ca-asg-provider-$tag-$a.oci.tar"
    printed="$(scripts/image.sh --arch "$a" --binary "${binary[$a]}" --ref "$repo:$tag-$a" --out "$archive")" ||
        die "scripts/image.sh --arch $a failed"
    image_digest[$a]="$(echo "$printed" | tail -n 1)"
    image_size[$a]="$(stat -c %s "$archive")"
    skopeo copy --quiet "${skopeo_opts[@]}" "oci-archive:$archive" "docker://$repo:$tag-$a" >&2 ||
        die "skopeo copy to $repo:$tag-$a failed"
    pushed="$("$crane" digest "${crane_opts[@]}" "$repo:$tag-$a")" || die "crane digest $repo:$tag-$a failed"
    [ "$pushed" = "${image_digest[$a]}" ] ||
        die "the registry has $pushed for $repo:$tag-$a, the archive is ${image_digest[$a]}"
    took
done
begin "index"
manifests=()
for a in "${arch_list[@]}"; do manifests+=(-m "$repo@${image_digest[$a]}"); done
"$crane" index append "${crane_opts[@]}" "${manifests[@]}" -t "$repo:$tag" >&2 || die "crane index append failed"
index_digest="$("$crane" digest "${crane_opts[@]}" "$repo:$tag")" || die "crane digest $repo:$tag failed"
took

# ---- 3. SBOMs ---------------------------------------------------------------------------
declare -A crate_sbom=() image_sbom=()
for a in "${arch_list[@]}"; do
    begin "SBOM $a"
    crate_sbom[$a]="$out/sbom-crate-$a.spdx.json"
    image_sbom[$a]="$out/sbom-image-$a.spdx.json"
    python3 scripts/sbom.py crate --target "$(triplet "$a")" --out "${crate_sbom[$a]}" || die "scripts/sbom.py crate failed"
    scripts/image.sh --packages --arch "$a" >"$out/packages-$a.txt"
    python3 scripts/sbom.py image --arch "$a" --binary "${binary[$a]}" --crate-sbom "${crate_sbom[$a]}" \
        --packages "$out/packages-$a.txt" --name "$repo:$tag" --out "${image_sbom[$a]}" ||
        die "scripts/sbom.py image failed"
    took
done

# ---- 4. signatures and attestations -----------------------------------------------------
sign_opts=(--yes)
if [ -n "$key" ]; then
    # Offline: no transparency log (cosign 3 takes that as "no signing config").
    sign_opts+=(--key "$key" --use-signing-config=false --tlog-upload=false)
fi
begin "sign $repo@$index_digest"
"$cosign" sign "${sign_opts[@]}" "${cosign_opts[@]}" --recursive "$repo@$index_digest" >&2 || die "cosign sign failed"
for a in "${arch_list[@]}"; do
    "$cosign" attest "${sign_opts[@]}" "${cosign_opts[@]}" --type spdxjson \
        --predicate "${image_sbom[$a]}" "$repo@${image_digest[$a]}" >&2 || die "cosign attest ($a SBOM) failed"
done
took

# ---- 5. the chart -----------------------------------------------------------------------
begin "chart"
chart_dir="$out/chart/ca-asg-provider"
rm -rf "$out/chart"
mkdir -p "$out/chart"
cp -r deploy/chart "$chart_dir"
# The published chart runs the published image, pinned by the index's digest.
python3 - "$chart_dir/values.yaml" "$repo" "$index_digest" "$chart_dir/Chart.yaml" "$tag" <<'PY' || die "could not pin the chart's image"
import re, sys
path, repo, digest, chart, tag = sys.argv[1:]
text = open(path).read()
# The placeholder's comment, and Artifact Hub's list of the chart's images, name it too.
text = text.replace("  # A placeholder: in standalone and bundled mode the chart refuses to render until this\n"
                    "  # names the repository you pushed the image to.\n",
                    "  # The release's image, pinned below to its multi-arch index (scripts/release.sh).\n")
meta = open(chart).read()
meta = re.sub(r"(?m)^(\s+image: )\S+/ca-asg-provider:\S+$", lambda m: f"{m.group(1)}{repo}:{tag}@{digest}", meta)
open(chart, "w").write(meta)
new, n1 = re.subn(r'(?m)^(image:\n(?:  .*\n|\s*#.*\n)*?  repository: ).*$', lambda m: m.group(1) + repo, text, count=1)
new, n2 = re.subn(r'(?m)^(image:\n(?:  .*\n|\s*#.*\n)*?  digest: ).*$', lambda m: m.group(1) + '"' + digest + '"', new, count=1)
if (n1, n2) != (1, 1):
    sys.exit(f"image.repository or image.digest not found in {path}")
open(path, "w").write(new)
PY
"$helm" package "$chart_dir" --version "$chart_version" --app-version "$tag" --destination "$out/chart" >&2 ||
    die "helm package failed"
chart_tgz="$out/chart/ca-asg-provider-$chart_version.tgz"
pushed="$("$helm" push "$chart_tgz" "oci://$registry/charts" "${helm_opts[@]}" 2>&1)" || die "helm push failed: $pushed"
echo "$pushed" >&2
chart_digest="$(echo "$pushed" | sed -n 's/^Digest: *//p')"
[ -n "$chart_digest" ] || die "helm push printed no digest"
took

# ---- 6. the result ----------------------------------------------------------------------
sha() { sha256sum "$1" | cut -d' ' -f1; }
{
    printf 'revision\t%s\nversion\t%s\nsource_date_epoch\t%s\n' "$revision" "$version" "$SOURCE_DATE_EPOCH"
    printf 'index\t%s\t%s\t%s\n' "$repo" "$tag" "$index_digest"
    for a in "${arch_list[@]}"; do
        printf 'arch\t%s\t%s\t%s\tsha256:%s\tsha256:%s\tsha256:%s\t%s\t%s\n' "$a" "$tag-$a" "${image_digest[$a]}" \
            "$(sha "${binary[$a]}")" "$(sha "${crate_sbom[$a]}")" "$(sha "${image_sbom[$a]}")" "${image_size[$a]}" "${built[$a]}"
    done
    printf 'chart\toci://%s/charts/ca-asg-provider\t%s\t%s\n' "$registry" "$chart_version" "$chart_digest"
    printf 'signed\t%s\n' "$([ -n "$key" ] && echo key || echo keyless)"
} | python3 -c '
import json, sys
r = {"platforms": {}}
for line in sys.stdin.read().splitlines():
    f = line.split("\t")
    if f[0] == "index":
        r["image"] = {"repository": f[1], "tag": f[2], "digest": f[3], "ref": f"{f[1]}@{f[3]}"}
    elif f[0] == "arch":
        repo = r["image"]["repository"]
        r["platforms"][f[1]] = {"tag": f[2], "digest": f[3], "ref": f"{repo}@{f[3]}", "binary_sha256": f[4],
                                "sbom_crate_sha256": f[5], "sbom_image_sha256": f[6], "archive_bytes": int(f[7]),
                                "binary": f[8]}
    elif f[0] == "chart":
        r["chart"] = {"repository": f[1], "version": f[2], "digest": f[3], "ref": f"{f[1]}:{f[2]}@{f[3]}"}
    else:
        r[f[0]] = f[1]
json.dump(r, sys.stdout, indent=1, sort_keys=True)
print()' >"$result.partial" || die "could not write $result"
mv "$result.partial" "$result"
step=''
say "done in $(($(date +%s) - started)) s: $repo@$index_digest; result in $result"
echo "$result"
