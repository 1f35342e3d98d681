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
. "$root/hack/bench-lib.sh"
bench_setup bench-agents "$root/target/agents-cluster"
nodes=${AGENTS_NODES:-1000}
period=${AGENTS_PERIOD:-30}
duration=${AGENTS_DURATION:-60}
targets=${AGENTS_TARGETS:-node,report}

bench_build

cleanup() {
  local rc=$?
  bench_cluster_down || log "WARNING: cluster-down failed for $dir"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bench_cluster_up

"$muster" dev agent-load --kubeconfig "$dir/kubeconfig" --nodes "$nodes" --period "$period" \
  --duration "$duration" --target "$targets"
