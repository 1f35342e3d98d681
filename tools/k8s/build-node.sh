#!/usr/bin/env bash
# Builds what a real node needs from the Go module proxy, cached outside the repo by version
# like the control plane (tools/k8s/build.sh): kubelet and kube-proxy at the control plane's
# Kubernetes version (into its bin folder), containerd with its runc shim and ctr, and the CNI
# plugins bridge, host-local, loopback and portmap (into a folder keyed by their versions).
# Does nothing for binaries already there. Prints two lines: the Kubernetes bin folder, then the
# runtime bin folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"
kbin=$(bash "$here/bindir.sh")
rbin=$(bash "$here/bindir.sh" node)
mkdir -p "$kbin" "$rbin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
log() { echo "real-node build: $*" >&2; }
start=$SECONDS
step() {
  local what=$1 t0=$SECONDS
  shift
  log "$what"
  "$@" || { log "$what: failed after $((SECONDS - t0))s"; return 1; }
  log "$what: done in $((SECONDS - t0))s"
}

minor=${K8S_VERSION#*.}; minor=${minor%%.*}
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=${K8S_VERSION%%.*}"
  ldf="$ldf -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
kube_pkgs=()
for b in kubelet kube-proxy; do
  [ -x "$kbin/$b" ] || kube_pkgs+=("k8s.io/kubernetes/cmd/$b")
done
kube_dir=$here
[ "$K8S_VERSION" = "$K8S_DEFAULT_VERSION" ] || kube_dir=$here/v${K8S_VERSION%.*}
if [ ${#kube_pkgs[@]} -gt 0 ]; then
  # Static, as the release binaries are: no cgo.
  (cd "$kube_dir" && CGO_ENABLED=0 step "go build ${kube_pkgs[*]##*/} v$K8S_VERSION" \
    go build -p "${MUSTER_GO_JOBS:-2}" -trimpath -tags selinux,notest -ldflags "$ldf" -o "$kbin/" "${kube_pkgs[@]}")
fi

# containerd without the btrfs, devmapper and zfs snapshotters (cgo and headers this image
# need not have): overlayfs and native are enough. Static, no cgo.
ctr_pkgs=()
for b in containerd containerd-shim-runc-v2 ctr; do
  [ -x "$rbin/$b" ] || ctr_pkgs+=("github.com/containerd/containerd/v2/cmd/$b@$CONTAINERD_VERSION")
done
if [ ${#ctr_pkgs[@]} -gt 0 ]; then
  cldf="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  for p in "${ctr_pkgs[@]}"; do
    CGO_ENABLED=0 GOBIN="$rbin" step "go install ${p##*/}" \
      go install -trimpath -tags no_btrfs,no_devmapper,no_zfs -ldflags "$cldf" "$p"
  done
fi
mkdir -p "$rbin/cni"
for b in bridge host-local loopback portmap; do
  [ -x "$rbin/cni/$b" ] && continue
  case $b in
    bridge | loopback) dir=main ;; host-local) dir=ipam ;; portmap) dir=meta ;;
  esac
  CGO_ENABLED=0 GOBIN="$rbin/cni" step "go install CNI $b $CNI_PLUGINS_VERSION" \
    go install -trimpath -ldflags "-s -w" "github.com/containernetworking/plugins/plugins/$dir/$b@$CNI_PLUGINS_VERSION"
done
log "ready in $((SECONDS - start))s"
echo "$kbin"
echo "$rbin"
