#!/usr/bin/env bash
# Build kwok v0.7.0 (sigs.k8s.io/kwok, from the Go module proxy) once, into the user's cache.
#
# The end-to-end tests (tests/e2e) and benchmarks/e2e.py fake nodes with kwok:
# it keeps kwok-managed nodes Ready (heartbeats, leases) and plays the lifecycle of
# the pods bound to them (Running, then gone once deleted), so kube-scheduler, the
# API server and preemptctl run for real while no kubelet exists. kwok is built
# from its own module with its own go.mod (its replace directives hold there, which
# `go install pkg@version` would refuse), so the binary is exactly kwok v0.7.0's.
#
# Usage: deploy/kube/build-kwok.sh      prints the binary's path
set -euo pipefail
KWOK_VERSION=${KWOK_VERSION:-0.7.0}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/preemptctl/kube
OUT=$CACHE/kwok-v$KWOK_VERSION
if [ -x "$OUT" ]; then echo "$OUT"; exit 0; fi
command -v go >/dev/null || { echo "build-kwok: the Go toolchain is needed to build kwok (go not on PATH)" >&2; exit 2; }
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/build-kwok.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
go mod init preemptctl.local/kwokbuild >/dev/null 2>&1
dir=$(go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "build-kwok: could not download sigs.k8s.io/kwok@v$KWOK_VERSION" >&2; exit 2; }
# The module cache is read-only: build from a writable copy of the module.
cp -r "$dir" src && chmod -R u+w src
cd src
echo "build-kwok: building kwok v$KWOK_VERSION (a few minutes on 2 cores once)" >&2
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" \
  -o "$OUT.tmp" ./cmd/kwok >&2
mv "$OUT.tmp" "$OUT"
echo "$OUT"
