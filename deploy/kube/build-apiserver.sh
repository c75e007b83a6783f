#!/usr/bin/env bash
# Build kube-apiserver from the Go module k8s.io/kubernetes, once, into the user's cache.
#
# The tests run the Kubernetes edge against a real API server (docs/architecture.md §6). No binary
# release is reachable from the project's machines (only the Go module proxy is), so
# it is built: a throwaway module requires k8s.io/kubernetes and replaces each staging
# module with its published v0.x twin (the main module's own go.mod points them at
# ./staging, which a module download does not have). ~10 min on 2 cores the first
# time; afterwards the cached binary is reused.
#
# Usage: deploy/kube/build-apiserver.sh           prints the binary's path
#        KUBE_VERSION=1.34.2 deploy/kube/build-apiserver.sh
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-1.34.2}
STAGING_VERSION=0.${KUBE_VERSION#1.}
MINOR=${KUBE_VERSION#1.}; MINOR=${MINOR%%.*}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/preemptctl/kube
OUT=$CACHE/kube-apiserver-v$KUBE_VERSION
if [ -x "$OUT" ]; then echo "$OUT"; exit 0; fi
command -v go >/dev/null || { echo "build-apiserver: the Go toolchain is needed to build kube-apiserver (go not on PATH)" >&2; exit 2; }
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init preemptctl.local/kubebuild >/dev/null 2>&1
dir=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "build-apiserver: could not download k8s.io/kubernetes@v$KUBE_VERSION" >&2; exit 2; }
{
  echo "require k8s.io/kubernetes v$KUBE_VERSION"
  grep -E '^\s*k8s.io/[A-Za-z0-9._-]+ => \./staging/' "$dir/go.mod" \
    | awk -v v="v$STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
} >> go.mod
cat > tools.go <<'GO'
//go:build tools

package kubebuild

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
echo "build-apiserver: resolving modules for kube-apiserver v$KUBE_VERSION" >&2
go mod tidy >&2
echo "build-apiserver: building (about 10 min on 2 cores the first time)" >&2
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR" \
  -o "$OUT.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
mv "$OUT.tmp" "$OUT"
echo "$OUT"
