#!/usr/bin/env bash
# Builds the local control plane's binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok, helm, prometheus, the LeaderWorkerSet controller) from the Go module proxy into a cache
# outside the repository. Each tool has its own module under e2e/tools/<tool>; it is rebuilt only
# when its go.mod, go.sum or this script's build flags change (a stamp per tool).
#
# Prints the directory that holds all binaries on its last line of stdout.
# Env: TANDEM_CACHE (default ~/.cache/tandem), TOOLS (space-separated subset to build).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
tools=${TOOLS:-"k8s etcd kwok helm prometheus lws"}
bindir="$cache/bin"
mkdir -p "$bindir"

log() { echo "[build-tools] $*" >&2; }

module_version() { # module_version DIR MODULE -> version required in DIR/go.mod
  (cd "$1" && go list -m -f '{{.Version}}' "$2")
}

build_k8s() {
  local v; v=$(module_version "$here/tools/k8s" k8s.io/kubernetes)
  local minor; minor=$(echo "$v" | cut -d. -f2)
  local ldf="-s -w -buildid="
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ldf="$ldf -X $p.gitCommit=go-module-$v -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  (cd "$here/tools/k8s" && go build -trimpath -tags notest,grpcnotrace -ldflags "$ldf" -o "$1/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
}

build_etcd() {
  (cd "$here/tools/etcd" && go build -trimpath -ldflags "-s -w" -o "$1/etcd" go.etcd.io/etcd/server/v3)
}

build_kwok() {
  (cd "$here/tools/kwok" && go build -trimpath -ldflags "-s -w" -o "$1/kwok" sigs.k8s.io/kwok/cmd/kwok)
  # The Logs CRD, so that `kubectl logs` reaches the pod runner's log files through kwok's server.
  local src; src=$(cd "$here/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  install -m 0644 "$src/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml" "$1/kwok-logs-crd.yaml"
}

build_helm() {
  local v; v=$(module_version "$here/tools/helm" helm.sh/helm/v3)
  local kv; kv=$(module_version "$here/tools/k8s" k8s.io/kubernetes)
  local minor; minor=$(echo "$kv" | cut -d. -f2)
  local ldf="-s -w -X helm.sh/helm/v3/internal/version.version=$v"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldf="$ldf -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
  done
  (cd "$here/tools/helm" && go build -trimpath -ldflags "$ldf" -o "$1/helm" helm.sh/helm/v3/cmd/helm)
}

build_prometheus() {
  # Only Kubernetes service discovery (file/http/static are always in); no UI assets.
  # The Go module v0.MMM.P is Prometheus v(M).(MM).P, e.g. v0.314.0 = 3.14.0.
  local v; v=$(module_version "$here/tools/prometheus" github.com/prometheus/prometheus)
  local mm=${v#v0.}; mm=${mm%%.*}
  local pv="${mm:0:1}.$((10#${mm:1})).${v##*.}"
  local ldf="-s -w" p=github.com/prometheus/common/version
  ldf="$ldf -X $p.Version=$pv -X $p.Revision=go-module-$v -X $p.Branch=HEAD -X $p.BuildUser=tandem"
  ldf="$ldf -X $p.BuildDate=20260101-00:00:00"
  (cd "$here/tools/prometheus" && go build -trimpath -ldflags "$ldf" \
    -tags remove_all_sd,enable_kubernetes_sd -o "$1/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
}

build_lws() {
  # The LeaderWorkerSet controller manager (its controllers and webhooks in one binary) and its CRD.
  local v; v=$(module_version "$here/tools/lws" sigs.k8s.io/lws)
  local ldf="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$v -X sigs.k8s.io/lws/pkg/version.GitCommit=go-module-$v"
  (cd "$here/tools/lws" && go build -trimpath -ldflags "$ldf" -o "$1/lws-controller" sigs.k8s.io/lws/cmd)
  local src; src=$(cd "$here/tools/lws" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)
  install -m 0644 "$src/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$1/lws-crd.yaml"
  # Its webhook configurations; the dev cluster points them at 127.0.0.1 (operator/tandem/devcluster/lws.py).
  install -m 0644 "$src/config/webhook/manifests.yaml" "$1/lws-webhooks.yaml"
}

for tool in $tools; do
  dir="$here/tools/$tool"
  stamp_src=$(cat "$dir/go.mod" "$dir/go.sum"; declare -f "build_$tool"; go env GOVERSION)
  stamp=$(printf '%s' "$stamp_src" | sha256sum | cut -c1-16)
  out="$cache/tools/$tool-$stamp"
  if [ -f "$out/.stamp" ]; then
    log "$tool: cached ($out)"
  else
    log "$tool: building into $out"
    start=$(date +%s)
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    "build_$tool" "$out.tmp"
    printf '%s\n' "$stamp_src" > "$out.tmp/.stamp"
    rm -rf "$out" && mv "$out.tmp" "$out"
    log "$tool: built in $(( $(date +%s) - start ))s"
    for old in "$cache/tools/$tool"-*; do # earlier versions of this tool
      [ "$old" = "$out" ] || rm -rf "$old"
    done
  fi
  for f in "$out"/*; do ln -sfn "$f" "$bindir/$(basename "$f")"; done
done
echo "$bindir"
