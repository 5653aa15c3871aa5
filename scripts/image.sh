#!/usr/bin/env bash
# Builds the service's OCI image without a Docker daemon and without a registry:
# Debian's `umoci` assembles the image from a minimal root (glibc, libgcc, the CA bundle,
# a passwd with the nonroot user 65532) taken from Debian packages pinned by version and
# SHA-256, plus the ca-asg-provider binary; `skopeo` writes it as an OCI archive that
# `ctr -n k8s.io images import`, `podman load` and `skopeo copy` read. Same files, same
# timestamps (the commit's time), same labels: the same image digest every time.
#
#   scripts/image.sh                               the release binary (built if missing)
#   scripts/image.sh --binary target/debug/ca-asg-provider --ref e2e.local/ca-asg-provider:ci
#   scripts/image.sh --arch arm64 --binary target/aarch64-unknown-linux-gnu/release/ca-asg-provider
#   scripts/image.sh --packages --arch arm64       only list the pinned Debian packages (name,
#                                                  version, arch, .deb SHA-256, URL; for the SBOM)
# Options:
#   --binary PATH   the binary to put in (default: target/release/ca-asg-provider, built
#                   with `cargo build --release --locked` when missing)
#   --arch ARCH     amd64 (default: this machine's) or arm64; the binary must be for it
#   --ref NAME:TAG  the image's name (default: localhost/ca-asg-provider:<Cargo version>)
#   --out FILE      the OCI archive (default: target/image/ca-asg-provider-<tag>-<arch>.oci.tar)
#
# Prints the archive's path, then its manifest digest. Downloads are cached in
# ${CA_ASG_IMAGE_CACHE:-~/.cache/ca-asg-provider/image}, outside the source tree.
# Needs umoci and skopeo (installed from Debian's packages when missing: apt-get, through
# sudo when not root), curl, python3 (as an ordinary user: umoci's rootless mode, owners
# set through the user.rootlesscontainers xattr, so the image is the same as root's),
# dpkg-deb. A Debian version the mirror no longer carries (superseded by a point release)
# is on snapshot.debian.org: DEBIAN_MIRROR=https://snapshot.debian.org/archive/debian/<date>
# (and DEBIAN_SECURITY_MIRROR=.../archive/debian-security/<date>).
set -euo pipefail
cd "$(dirname "$0")/.."

# The runtime files: Debian 12 (bookworm) packages, by pool path, version and SHA-256 per
# architecture (ca-certificates is architecture-independent). Bump all three together.
LIBC6_VERSION='2.36-9+deb12u14'
LIBC6_SHA256_amd64='ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf'
LIBC6_SHA256_arm64='01f4330719fd4f65580e16ea5a0527f372fca750e8f588d26deaf09f2d3b1cf4'
LIBGCC_VERSION='12.2.0-14+deb12u1'
LIBGCC_SHA256_amd64='3016e62cb4b7cd8038822870601f5ed131befe942774d0f745622cc77d8a88f7'
LIBGCC_SHA256_arm64='576926b283613db80168ddf76380a3bd877602778cf0d226caa7bfbfa71eacf3'
# gcc-12-base: only for libgcc-s1's copyright file (its doc directory links there).
GCCBASE_SHA256_amd64='1896a2aacf4ad681ff5eacc24a5b0ca4d5d9c9b9c9e4b6de5197bc1e116ea619'
GCCBASE_SHA256_arm64='674cf6cba6d432bd200c45fe866c1652c7a53523cc2e7a613e05bc4abf7b5440'
CACERTS_VERSION='20250419~deb12u2'
CACERTS_SHA256='b9f76b5271a7ac373fd5e7e1b5b826a71ddd702b42a0d104955ecb1acfffc94b'
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"

die() { echo "error: image: $*" >&2; exit 1; }

binary=''
arch=''
ref=''
out=''
packages_only=''
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift ;;
        --arch) arch="$2"; shift ;;
        --ref) ref="$2"; shift ;;
        --out) out="$2"; shift ;;
        --packages) packages_only=1 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    esac
    shift
done

if [ -z "$arch" ]; then
    case "$(uname -m)" in
        x86_64) arch=amd64 ;;
        aarch64) arch=arm64 ;;
        *) die "unsupported machine $(uname -m): pass --arch amd64 or --arch arm64" ;;
    esac
fi
case "$arch" in
    amd64) triplet=x86_64-linux-gnu; elf_machine='X86-64'; loader_link='lib64/ld-linux-x86-64.so.2' ;;
    arm64) triplet=aarch64-linux-gnu; elf_machine='AArch64'; loader_link='' ;;
    *) die "--arch must be amd64 or arm64, not $arch" ;;
esac

cache="${CA_ASG_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ca-asg-provider/image}"
mkdir -p "$cache/debs"

# One pinned .deb into the cache (kept once its SHA-256 matches).
fetch_deb() { # url sha256
    local url="$1" sum="$2" file
    file="$cache/debs/$(basename "$url")"
    if [ -s "$file" ] && echo "$sum  $file" | sha256sum -c --status; then
        echo "$file"; return
    fi
    echo "== image: downloading $url" >&2
    # A download of its own (two builds at once, as the tests run them, must not write
    # into one file), moved into place whole.
    local partial
    partial="$(mktemp "$file.XXXXXX.partial")"
    curl -fsSL --retry 3 -o "$partial" "$url" || { rm -f "$partial"; die "could not download $url (a superseded version: see DEBIAN_MIRROR in the header)"; }
    if ! echo "$sum  $partial" | sha256sum -c --status; then
        rm -f "$partial"
        die "$url: SHA-256 is not the pinned $sum"
    fi
    mv "$partial" "$file"
    echo "$file"
}

# The pinned packages of $arch: name, version, architecture, SHA-256, URL, one a line.
pinned_packages() {
    local sum_libc="LIBC6_SHA256_$arch" sum_gcc="LIBGCC_SHA256_$arch" sum_base="GCCBASE_SHA256_$arch"
    echo "libc6 $LIBC6_VERSION $arch ${!sum_libc} $DEBIAN_MIRROR/pool/main/g/glibc/libc6_${LIBC6_VERSION}_$arch.deb"
    echo "libgcc-s1 $LIBGCC_VERSION $arch ${!sum_gcc} $DEBIAN_MIRROR/pool/main/g/gcc-12/libgcc-s1_${LIBGCC_VERSION}_$arch.deb"
    echo "gcc-12-base $LIBGCC_VERSION $arch ${!sum_base} $DEBIAN_MIRROR/pool/main/g/gcc-12/gcc-12-base_${LIBGCC_VERSION}_$arch.deb"
    echo "ca-certificates $CACERTS_VERSION all $CACERTS_SHA256 $DEBIAN_SECURITY_MIRROR/pool/updates/main/c/ca-certificates/ca-certificates_${CACERTS_VERSION}_all.deb"
}

# The runtime files on a minimal root, in DIR (owned by root, the nonroot home by 65532).
build_rootfs() { # dir
    local root="$1" tmp libc gcc base cacerts pins
    command -v dpkg-deb >/dev/null || die "dpkg-deb is needed (Debian's dpkg)"
    pins="$(pinned_packages)"
    pin() { echo "$pins" | awk -v n="$1" '$1 == n { print $5, $4 }'; }
    # shellcheck disable=SC2046 # url and sum, two words
    libc="$(fetch_deb $(pin libc6))"
    # shellcheck disable=SC2046
    gcc="$(fetch_deb $(pin libgcc-s1))"
    # shellcheck disable=SC2046
    base="$(fetch_deb $(pin gcc-12-base))"
    # shellcheck disable=SC2046
    cacerts="$(fetch_deb $(pin ca-certificates))"
    tmp="$(mktemp -d)"
    for d in "$libc" "$gcc" "$base" "$cacerts"; do
        dpkg-deb -x "$d" "$tmp/$(basename "$d" .deb)"
    done
    mkdir -p "$root"/{etc/ssl/certs,lib/"$triplet",usr/local/bin,usr/share/doc,tmp,home/nonroot}
    # glibc's shared libraries and loader (not gconv, locales or tools), libgcc_s.
    cp -a "$tmp"/libc6_*/lib/"$triplet"/. "$root/lib/$triplet/"
    cp -a "$tmp"/libgcc-s1_*/lib/"$triplet"/libgcc_s.so.1 "$root/lib/$triplet/"
    if [ -n "$loader_link" ]; then
        mkdir -p "$root/$(dirname "$loader_link")"
        cp -a "$tmp/libc6_${LIBC6_VERSION}_$arch/$loader_link" "$root/$loader_link"
    else
        cp -a "$tmp/libc6_${LIBC6_VERSION}_$arch"/lib/ld-linux-aarch64.so.1 "$root/lib/"
    fi
    # The CA bundle, as update-ca-certificates makes it from every Mozilla certificate.
    find "$tmp"/ca-certificates_*/usr/share/ca-certificates/mozilla -name '*.crt' -print0 |
        LC_ALL=C sort -z | xargs -0 cat >"$root/etc/ssl/certs/ca-certificates.crt"
    [ -s "$root/etc/ssl/certs/ca-certificates.crt" ] || die "empty CA bundle from $cacerts"
    # The packages' copyright files travel with their files.
    for p in libc6:libc6 gcc-12-base:libgcc-s1 ca-certificates:ca-certificates; do
        mkdir -p "$root/usr/share/doc/${p#*:}"
        cp "$tmp/${p%%:*}_"*/usr/share/doc/"${p%%:*}"/copyright "$root/usr/share/doc/${p#*:}/"
    done
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
        'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$root/etc/group"
    printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$root/etc/nsswitch.conf"
    chmod 1777 "$root/tmp"
    own_nonroot "$root/home/nonroot"
    chmod 0700 "$root/home/nonroot"
    rm -rf "$tmp"
}

if [ -n "$packages_only" ]; then
    pinned_packages
    exit 0
fi

missing=()
command -v umoci >/dev/null || missing+=(umoci)
command -v skopeo >/dev/null || missing+=(skopeo)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "needs ${missing[*]} (Debian and Ubuntu: apt-get install ${missing[*]}; on a Mac run this in a Debian container or VM)"
    echo "== image: installing ${missing[*]} from Debian's packages" >&2
    # Two builds at once (the e2e tests run side by side) share dpkg's lock: the
    # second waits for it instead of failing.
    apt=(apt-get -o DPkg::Lock::Timeout=600)
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "needs ${missing[*]} (as root: apt-get install ${missing[*]})"
        apt=(sudo "${apt[@]}")
    fi
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
        { "${apt[@]}" update -qq >&2 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >&2; }
fi
# Owners in the layers: root's files are root's; the nonroot home is 65532's. As root,
# chown says so; as an ordinary user umoci's rootless mode records the user's own files
# as root's and takes other owners from the user.rootlesscontainers xattr (no daemon, no
# root, the same layers).
rootless=()
if [ "$(id -u)" != 0 ]; then
    rootless=(--rootless)
    command -v python3 >/dev/null || die "python3 is needed to build the image as an ordinary user"
fi
own_nonroot() { # path
    if [ ${#rootless[@]} -eq 0 ]; then
        chown 65532:65532 "$1"
    else
        # rootlesscontainers.io's protobuf: uid (field 1) and gid (field 2), varint 65532.
        python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.rootlesscontainers", bytes.fromhex("08fcff0310fcff03"))' "$1" ||
            die "cannot set the user.rootlesscontainers xattr on $1 (a filesystem without user xattrs? set TMPDIR to one that has them)"
    fi
}

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
if [ -z "$binary" ]; then
    binary=target/release/ca-asg-provider
    if [ ! -x "$binary" ]; then
        echo "== image: building the release binary (cargo build --release --locked)" >&2
        cargo build --release --locked --bin ca-asg-provider >&2
    fi
fi
[ -x "$binary" ] || die "no binary at $binary"
machine="$(LC_ALL=C readelf -h "$binary" 2>/dev/null | sed -n 's/^ *Machine: *//p')"
case "$machine" in
    *"$elf_machine"*) ;;
    *) die "$binary is for '${machine:-not an ELF file}', not $arch" ;;
esac
ref="${ref:-localhost/ca-asg-provider:$version}"
tag="${ref##*:}"
[ "$tag" != "$ref" ] || die "--ref must be NAME:TAG, not $ref"
out="${out:-target/image/ca-asg-provider-$tag-$arch.oci.tar}"

# Labels name the commit; timestamps are the commit's, so a rebuild of the same inputs
# gives the same digest. A tree with uncommitted changes says so in the revision.
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    revision="$revision-dirty"
fi
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack "${rootless[@]}" --image "$layout:$tag" "$work/bundle" >/dev/null
root="$work/bundle/rootfs"
stamp() { find "$root" -exec touch -h -d "@$epoch" {} +; }

# Layer 1: the runtime files (shared by every build of the same pins).
build_rootfs "$root"
stamp
umoci repack --refresh-bundle --image "$layout:$tag" --history.created "$created" \
    --history.created_by "scripts/image.sh: libc6 $LIBC6_VERSION, libgcc-s1 $LIBGCC_VERSION, ca-certificates $CACERTS_VERSION ($arch), passwd" \
    "$work/bundle"
# Layer 2: the binary.
if [ ${#rootless[@]} -eq 0 ]; then
    install -m 0755 -o 0 -g 0 "$binary" "$root/usr/local/bin/ca-asg-provider"
else
    install -m 0755 "$binary" "$root/usr/local/bin/ca-asg-provider"
fi
stamp
umoci repack --refresh-bundle --image "$layout:$tag" --history.created "$created" \
    --history.created_by "scripts/image.sh: /usr/local/bin/ca-asg-provider" "$work/bundle"

# User 65532, the entrypoint, command and ports (docs/image.md).
cfg=(--image "$layout:$tag" --no-history --created "$created" --architecture "$arch" --os linux
    --config.user 65532:65532 --config.workingdir /home/nonroot
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
    --config.entrypoint /usr/local/bin/ca-asg-provider
    --config.cmd serve --config.cmd --config --config.cmd /etc/ca-asg-provider/config.yaml
    --config.cmd --log-format --config.cmd json
    --config.exposedports 8086/tcp --config.exposedports 8087/tcp)
for kv in "org.opencontainers.image.title=ca-asg-provider" \
    "org.opencontainers.image.version=$version" \
    "org.opencontainers.image.revision=$revision" \
    "org.opencontainers.image.created=$created" \
    "org.opencontainers.image.licenses=Apache-2.0" \
    "org.opencontainers.image.base.name=debian:bookworm libc6=$LIBC6_VERSION libgcc-s1=$LIBGCC_VERSION ca-certificates=$CACERTS_VERSION"; do
    cfg+=(--config.label "$kv" --manifest.annotation "$kv")
done
umoci config "${cfg[@]}"
umoci gc --layout "$layout"

mkdir -p "$(dirname "$out")"
rm -f "$out"
# skopeo names the image (index.json's ref.name: the full NAME:TAG, which ctr import
# uses); GNU tar packs the layout with fixed owners, order and times, so the archive's
# bytes are reproducible too.
skopeo copy --quiet "oci:$layout:$tag" "oci:$work/named:$ref"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    -C "$work/named" -cf "$out" oci-layout index.json blobs
digest="$(skopeo inspect --raw "oci-archive:$out" | sha256sum | cut -d' ' -f1)"
echo "$out"
echo "sha256:$digest"
