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

missing=()
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok helm; do
  [ -x "$bin/$b" ] || missing+=("$b")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi
log "building ${missing[*]} into $bin (cold build: about 15-30 minutes on 2 cores)"
start=$(date +%s)

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
cd "$here"
if [ ${#kube_pkgs[@]} -gt 0 ]; then
  log "go build ${kube_pkgs[*]}"
  go build -p "${MUSTER_GO_JOBS:-2}" -trimpath -tags selinux,notest -ldflags "$ldf" -o "$bin/" "${kube_pkgs[@]}"
fi
if [ ! -x "$bin/etcd" ]; then
  log "go build etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
fi
if [ ! -x "$bin/kwok" ]; then
  log "go install kwok $KWOK_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
if [ ! -x "$bin/helm" ]; then
  log "go install helm $HELM_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
# kwok needs its stage definitions at run time; keep them beside the binaries.
kwok_src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION
if [ ! -d "$bin/../kwok-stages" ]; then
  [ -d "$kwok_src" ] || go mod download "sigs.k8s.io/kwok@$KWOK_VERSION"
  mkdir -p "$bin/../kwok-stages" && cp -r "$kwok_src/kustomize/stage/." "$bin/../kwok-stages/"
  chmod -R u+w "$bin/../kwok-stages"
fi
log "built in $(( $(date +%s) - start ))s"
echo "$bin"
