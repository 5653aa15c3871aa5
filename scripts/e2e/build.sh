#!/usr/bin/env bash
# Builds the upstream parts of the end-to-end suite from the Go module proxy into a
# cache outside the source tree (nothing upstream is committed or fetched elsewhere):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet from k8s.io/kubernetes,
#   and an etcd server from go.etcd.io/etcd/server/v3.
# Usage: scripts/e2e/build.sh [K8S_VERSION ...]   (default: the newest the suite runs)
# Prints the directory of each version's binaries. Idempotent: a built version is reused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"

cache="$(e2e_cache)"
mkdir -p "$cache"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("$K8S_DEFAULT")

# One go.mod per build, with the replace lines k8s.io/kubernetes needs as a dependency:
# its own go.mod points every k8s.io staging module at ./staging/src, which Go ignores
# outside its own tree, so each is pinned to the published v0.<minor>.<patch>.
k8s_gomod() {
    local version="$1" staging_version="v0${1#v1}" upstream
    upstream="$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$version" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    echo "module e2ebuild/kubernetes"
    echo
    grep -E '^go [0-9]' "$upstream"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo "replace ("
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$upstream" |
        awk -v v="$staging_version" '{ print "\t" $1 " => " $1 " " v }'
    echo ")"
}

build_k8s() {
    local version="$1" dir out
    dir="$cache/build/kubernetes-$version"
    out="$cache/bin/kubernetes-$version"
    if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ] &&
        [ -x "$out/kube-scheduler" ] && [ -x "$out/kubelet" ]; then
        echo "$out"
        return
    fi
    mkdir -p "$dir" "$out"
    k8s_gomod "$version" >"$dir/go.mod"
    cat >"$dir/tools.go" <<'GO'
//go:build tools

// Package tools pins the commands this build makes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
    (
        cd "$dir"
        echo "== e2e build: resolving k8s.io/kubernetes $version" >&2
        GOFLAGS=-mod=mod go mod tidy -e >&2
        for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
            echo "== e2e build: $cmd $version" >&2
            CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w \
                -X k8s.io/component-base/version.gitVersion=$version \
                -X k8s.io/component-base/version.gitMajor=1 \
                -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2)" \
                -o "$out/$cmd.partial" "k8s.io/kubernetes/cmd/$cmd" >&2
            mv "$out/$cmd.partial" "$out/$cmd"
        done
    )
    echo "$out"
}

build_etcd() {
    local version="$ETCD_VERSION" dir out
    dir="$cache/build/etcd-$version"
    out="$cache/bin/etcd-$version"
    if [ -x "$out/etcd" ]; then
        echo "$out"
        return
    fi
    mkdir -p "$dir" "$out"
    cat >"$dir/go.mod" <<GOMOD
module e2ebuild/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $version
GOMOD
    cat >"$dir/main.go" <<'GO'
// Command etcd starts the etcd server of the pinned module version.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    (
        cd "$dir"
        echo "== e2e build: etcd $version" >&2
        GOFLAGS=-mod=mod go mod tidy >&2
        CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/etcd.partial" . >&2
        mv "$out/etcd.partial" "$out/etcd"
    )
    echo "$out"
}

build_etcd
for v in "${versions[@]}"; do
    build_k8s "$v"
done
