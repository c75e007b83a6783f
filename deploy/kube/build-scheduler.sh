#!/usr/bin/env bash
# Build kube-scheduler v1.34.2 with the PreemptionToleration plugin registered, once, into the user's cache.
#
# The end-to-end tests (tests/e2e) run kube-scheduler next to preemptctl, and the
# parity tests (tests/parity) compare preemptctl's answers with kube-scheduler's
# DefaultPreemption and with scheduler-plugins' PreemptionToleration. One binary
# serves both: it is kube-scheduler built from k8s.io/kubernetes v1.34.2 (the same
# version as the API server, so the build cache kube-apiserver left is reused:
# ~3 min instead of ~10), with `preemptiontoleration.New` from
# sigs.k8s.io/scheduler-plugins v0.34.7 registered through
# app.NewSchedulerCommand(app.WithPlugin(...)), exactly as scheduler-plugins'
# own cmd/scheduler does. A profile that does not enable the plugin is plain
# kube-scheduler v1.34.2.
#
# scheduler-plugins v0.34.7 asks for k8s v1.34.7; the replace lines pin v1.34.2 and
# its staging twins v0.34.2 instead (a patch release: the plugin's API is the same).
# The proxy does not list scheduler-plugins, but `go mod download` of the exact
# version works.
#
# Usage: deploy/kube/build-scheduler.sh      prints the binary's path
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-1.34.2}
PLUGINS_VERSION=${PLUGINS_VERSION:-0.34.7}
STAGING_VERSION=0.${KUBE_VERSION#1.}
MINOR=${KUBE_VERSION#1.}; MINOR=${MINOR%%.*}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/preemptctl/kube
OUT=$CACHE/kube-scheduler-v$KUBE_VERSION-plugins-v$PLUGINS_VERSION
if [ -x "$OUT" ]; then echo "$OUT"; exit 0; fi
command -v go >/dev/null || { echo "build-scheduler: the Go toolchain is needed to build kube-scheduler (go not on PATH)" >&2; exit 2; }
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/build-scheduler.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init preemptctl.local/schedulerbuild >/dev/null 2>&1
dir=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "build-scheduler: could not download k8s.io/kubernetes@v$KUBE_VERSION" >&2; exit 2; }
go mod download "sigs.k8s.io/scheduler-plugins@v$PLUGINS_VERSION" \
  || { echo "build-scheduler: could not download sigs.k8s.io/scheduler-plugins@v$PLUGINS_VERSION" >&2; exit 2; }
{
  echo "require k8s.io/kubernetes v$KUBE_VERSION"
  echo "require sigs.k8s.io/scheduler-plugins v$PLUGINS_VERSION"
  echo "replace k8s.io/kubernetes => k8s.io/kubernetes v$KUBE_VERSION"
  grep -E '^\s*k8s.io/[A-Za-z0-9._-]+ => \./staging/' "$dir/go.mod" \
    | awk -v v="v$STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
} >> go.mod
cat > main.go <<'GO'
// kube-scheduler with the PreemptionToleration plugin registered (as scheduler-plugins' cmd/scheduler).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/preemptiontoleration"
)

func main() {
	command := app.NewSchedulerCommand(
		app.WithPlugin(preemptiontoleration.Name, preemptiontoleration.New),
	)
	os.Exit(cli.Run(command))
}
GO
echo "build-scheduler: resolving modules for kube-scheduler v$KUBE_VERSION + scheduler-plugins v$PLUGINS_VERSION" >&2
go mod tidy >&2
echo "build-scheduler: building (about 3 min on 2 cores once kube-apiserver's build cache is warm)" >&2
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR" \
  -o "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
echo "$OUT"
