#!/usr/bin/env bash
# Prints the cache folder holding the control plane binaries for the pinned versions (with
# `node`: the real node's runtime binaries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.env"
cache=${MUSTER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/muster}
# `bindir.sh node`: the real node's container runtime and CNI plugins (tools/k8s/build-node.sh).
if [ "${1:-}" = node ]; then
  echo "$cache/node-containerd-$CONTAINERD_VERSION-cni-$CNI_PLUGINS_VERSION/bin"
else
  echo "$cache/k8s-v$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION/bin"
fi
