#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kube-scheduler, kube-controller-manager,
# kubectl, etcd, kwok, helm) from the Go module proxy into a cache folder outside the repo,
# keyed by the versions. Does nothing for binaries already there. Prints the bin folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"
bin=$(bash "$here/bindir.sh")
mkdir -p "$bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "controlplane: $*" >&2; }

# Runs "$@" (one go build or go install) as step $1 and logs when it ends; while it runs, a
# watcher logs each binary named in $2 as it lands in $bin and a heartbeat every 30 s, since a
# cold build takes minutes. The watcher writes to stderr only (so `bin=$(build.sh)` never waits
# on it) and is stopped here, or stops itself within a second once this script is gone.
build_step() {
  local what=$1 binaries=$2 t0=$SECONDS rc=0 watcher
  shift 2
  log "$what"
  (
    declare -A seen
    next=$((t0 + 30))
    while sleep 1 > /dev/null 2>&1 && kill -0 $$ 2> /dev/null; do
      for b in $binaries; do
        if [ -z "${seen[$b]:-}" ] && [ -x "$bin/$b" ]; then
          seen[$b]=1
          log "  $b built ($((SECONDS - t0))s)"
        fi
      done
      if [ $SECONDS -ge $next ]; then
        pending=$(for b in $binaries; do [ -n "${seen[$b]:-}" ] || printf '%s ' "$b"; done)
        log "  still building ${pending% } ($((SECONDS - t0))s)"
        next=$((next + 30))
      fi
    done
  ) >&2 &
  watcher=$!
  "$@" || rc=$?
  kill "$watcher" 2> /dev/null || true
  wait "$watcher" 2> /dev/null || true
  [ $rc -eq 0 ] || { log "$what: failed after $((SECONDS - t0))s"; return $rc; }
  log "$what: done in $((SECONDS - t0))s ($((SECONDS - start))s in all)"
}

missing=()
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok helm; do
  [ -x "$bin/$b" ] || missing+=("$b")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi
log "building ${missing[*]} into $bin (cold build: about 10-15 minutes on 2 cores)"
start=$SECONDS

ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=${K8S_VERSION%%.*}"
  minor=${K8S_VERSION#*.}; minor=${minor%%.*}
  ldf="$ldf -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

kube_pkgs=()
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  [ -x "$bin/$b" ] || kube_pkgs+=("k8s.io/kubernetes/cmd/$b")
done
# The Kubernetes binaries build in the module of their version (the default one here, others
# in v<major>.<minor>/); etcd in the default module, whatever the version.
kube_dir=$here
if [ "$K8S_VERSION" != "$K8S_DEFAULT_VERSION" ]; then
  kube_dir=$here/v${K8S_VERSION%.*}
  [ -f "$kube_dir/go.mod" ] || { log "no module for Kubernetes $K8S_VERSION: $kube_dir/go.mod"; exit 1; }
  grep -q "k8s.io/kubernetes v$K8S_VERSION" "$kube_dir/go.mod" \
    || { log "$kube_dir/go.mod is not for Kubernetes $K8S_VERSION"; exit 1; }
fi
cd "$kube_dir"
if [ ${#kube_pkgs[@]} -gt 0 ]; then
  build_step "go build ${kube_pkgs[*]##*/} v$K8S_VERSION" "${kube_pkgs[*]##*/}" \
    go build -p "${MUSTER_GO_JOBS:-2}" -trimpath -tags selinux,notest -ldflags "$ldf" -o "$bin/" "${kube_pkgs[@]}"
fi
cd "$here"
# etcd, kwok and helm do not depend on the Kubernetes version: another version's cache takes
# them from the default version's, when that is built.
default_bin=$(MUSTER_K8S_VERSION= bash "$here/bindir.sh")
if [ "$default_bin" != "$bin" ]; then
  for b in etcd kwok helm; do
    [ -x "$bin/$b" ] || [ ! -x "$default_bin/$b" ] || cp "$default_bin/$b" "$bin/$b"
  done
  [ -d "$bin/../kwok-stages" ] || [ ! -d "$default_bin/../kwok-stages" ] || cp -r "$default_bin/../kwok-stages" "$bin/../kwok-stages"
fi
if [ ! -x "$bin/etcd" ]; then
  build_step "go build etcd $ETCD_VERSION" etcd go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
fi
if [ ! -x "$bin/kwok" ]; then
  build_step "go install kwok $KWOK_VERSION" kwok env GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
if [ ! -x "$bin/helm" ]; then
  build_step "go install helm $HELM_VERSION" helm env GOBIN="$bin" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
# kwok needs its stage definitions at run time; keep them beside the binaries.
kwok_src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION
if [ ! -d "$bin/../kwok-stages" ]; then
  [ -d "$kwok_src" ] || go mod download "sigs.k8s.io/kwok@$KWOK_VERSION"
  mkdir -p "$bin/../kwok-stages" && cp -r "$kwok_src/kustomize/stage/." "$bin/../kwok-stages/"
  chmod -R u+w "$bin/../kwok-stages"
fi
log "built in $((SECONDS - start))s"
echo "$bin"
