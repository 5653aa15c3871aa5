#!/usr/bin/env bash
# What a real node of the end-to-end suite needs on this machine: Debian's containerd,
# runc, CNI plugins (bridge, host-local, loopback) and busybox-static, and the image
# tools scripts/image.sh uses (umoci, skopeo: here, once, and not by two tests that
# build images at the same time), installed when missing (as root: the machines of this project run as root); then the node's images
# (scripts/e2e/images.py: a static pause and a busybox image, no registry) built into the
# cache. Prints the images directory. Exits non-zero, saying why, when it cannot.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/versions.sh"

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v umoci >/dev/null || missing+=(umoci)
command -v skopeo >/dev/null || missing+=(skopeo)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 || missing+=(busybox-static)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "error: a real node needs ${missing[*]} (install them as root)" >&2
        exit 1
    fi
    echo "== e2e: installing ${missing[*]} from Debian's packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Another apt-get (an image build's) may hold dpkg's lock: wait for it.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

images="$(e2e_cache)/images"
if [ ! -s "$images/pause.tar" ] || [ ! -s "$images/busybox.tar" ] ||
    [ "$here/images.py" -nt "$images/busybox.tar" ]; then
    python3 "$here/images.py" "$images" >&2
fi
echo "$images"
