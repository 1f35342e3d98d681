# Sourced by hack/bench-e2e.sh and hack/bench-agents.sh: what both do around a control plane of
# their own. The caller sets `root` (the repository) and calls bench_setup first.

# bench_setup NAME DEFAULT_DIR: sets `dir` (MUSTER_CLUSTER_DIR, else DEFAULT_DIR, made absolute),
# `bin` (the control plane binaries), `muster` (the release binary) and log/die prefixed NAME.
bench_setup() {
  bench_name=$1
  dir=${MUSTER_CLUSTER_DIR:-$2}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  bin=${MUSTER_K8S_BIN:-$(bash "$root/tools/k8s/bindir.sh")}
  muster=${CARGO_TARGET_DIR:-$root/target}/release/muster
}

log() { echo "$bench_name: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# bench_build [cargo args]: builds muster in release mode.
bench_build() {
  log "building muster (release${1:+, $*})"
  cargo build --release --quiet -p muster "$@" || die "cargo build --release failed"
  [ -x "$muster" ] || die "$muster was not built"
}

# crd_without_rules: a CRD's JSON on stdin, written to stdout with every x-kubernetes-validations
# rule of its versions removed (what the rules cost: bench-e2e's BENCH_CRD_RULES, bench-writes'
# rule-free twins).
crd_without_rules() {
  python3 -c '
import json, sys
crd = json.load(sys.stdin)
def strip(node):
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        for v in node.values():
            strip(v)
    elif isinstance(node, list):
        for v in node:
            strip(v)
strip(crd["spec"]["versions"])
print(json.dumps(crd))'
}

# bench_cluster_down: stops the control plane in `dir` (and a muster marked with it).
bench_cluster_down() {
  MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" > /dev/null 2>&1
}

# bench_cluster_up: a fresh control plane in `dir` (whatever ran there before is stopped); the
# environment (MUSTER_APISERVER_EXTRA_ARGS, ...) reaches hack/cluster-up.sh. Its log is
# `$dir.cluster-up.log`, printed when it fails.
bench_cluster_up() {
  bench_cluster_down || true
  log "control plane in $dir"
  MUSTER_CLUSTER_DIR=$dir MUSTER_K8S_BIN=$bin bash "$root/hack/cluster-up.sh" > "$dir.cluster-up.log" 2>&1 \
    || { cat "$dir.cluster-up.log" >&2; die "cluster-up failed"; }
}
