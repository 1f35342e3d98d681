#!/usr/bin/env bash
# Node watch traffic of GPU health, before and after NodeGPUReport (`make bench-agents`): builds
# muster in release, starts a control plane of its own (hack/cluster-up.sh in
# target/agents-cluster, muster's CRDs installed), then `muster dev agent-load`: N kwok GPU nodes
# and N simulated node agents writing health every P s for D s, first as the old annotation
# merge patch on the Node (--target node), then as the node's NodeGPUReport (--target report).
# Prints, per target, the writes and the API server's watch events and bytes sent per second for
# nodes and nodegpureports. Everything it started is stopped on exit.
#
#   AGENTS_NODES (1000)  AGENTS_PERIOD (30 s)  AGENTS_DURATION (60 s)  AGENTS_TARGETS (node,report)
#   MUSTER_CLUSTER_DIR (target/agents-cluster)  MUSTER_K8S_BIN (tools/k8s/bindir.sh)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${MUSTER_CLUSTER_DIR:-$root/target/agents-cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin=${MUSTER_K8S_BIN:-$(bash "$root/tools/k8s/bindir.sh")}
nodes=${AGENTS_NODES:-1000}
period=${AGENTS_PERIOD:-30}
duration=${AGENTS_DURATION:-60}
targets=${AGENTS_TARGETS:-node,report}
muster=${CARGO_TARGET_DIR:-$root/target}/release/muster

log() { echo "bench-agents: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

log "building muster (release)"
cargo build --release --quiet -p muster || die "cargo build --release failed"
[ -x "$muster" ] || die "$muster was not built"

cleanup() {
  local rc=$?
  MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" > /dev/null 2>&1 || log "WARNING: cluster-down failed for $dir"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" > /dev/null 2>&1 || true
log "control plane in $dir"
MUSTER_CLUSTER_DIR=$dir MUSTER_K8S_BIN=$bin bash "$root/hack/cluster-up.sh" > "$dir.cluster-up.log" 2>&1 \
  || { cat "$dir.cluster-up.log" >&2; die "cluster-up failed"; }

"$muster" dev agent-load --kubeconfig "$dir/kubeconfig" --nodes "$nodes" --period "$period" \
  --duration "$duration" --target "$targets"
