#!/usr/bin/env bash
# The side-by-side scale benchmark (`make bench-e2e`): builds muster in release, starts a control
# plane of its own (hack/cluster-up.sh in target/bench-cluster, upstream GenericWorkload and
# WorkloadWithJob on), runs `muster run` against it, then `muster dev bench`: N kwok GPU nodes,
# then the same G gangs of S one-GPU pods as plain Jobs, upstream gang Jobs and MusterJobs, one
# path after the other. Prints the table and writes the numbers as JSON. Everything it started
# is stopped on exit.
#
#   BENCH_NODES (1000)  BENCH_GANGS (200)  BENCH_SIZE (3)  BENCH_PATHS (plain,gang,muster,muster-upstream)
#   BENCH_OUT (target/bench-e2e.json)  BENCH_TIMEOUT (600 s per path)  BENCH_CONCURRENCY (16)
#   BENCH_RATE (gangs created per second per path; 0, the default: as fast as creates go)
#   BENCH_PROFILE=perf|heaptrack: record muster's CPU samples (perf record) or its heap
#   (heaptrack attached; muster is then built with the system allocator, which heaptrack sees)
#   during the whole run, into $MUSTER_CLUSTER_DIR/profile/
#   BENCH_HOSTILE=1: before muster starts (so no webhook refuses it), a tenant's MusterJob of
#   50,000,000 Indexed pods is created in namespace bench-hostile: muster must run the paths
#   beside it with its memory bounded (the job is Invalid, no pod of it is made); its status and
#   the pods of that namespace are printed at the end
#   MUSTER_CLUSTER_DIR (target/bench-cluster)  MUSTER_K8S_BIN (tools/k8s/bindir.sh)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${MUSTER_CLUSTER_DIR:-$root/target/bench-cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin=${MUSTER_K8S_BIN:-$(bash "$root/tools/k8s/bindir.sh")}
nodes=${BENCH_NODES:-1000}
gangs=${BENCH_GANGS:-200}
size=${BENCH_SIZE:-3}
paths=${BENCH_PATHS:-plain,gang,muster,muster-upstream}
out=${BENCH_OUT:-$root/target/bench-e2e.json}
timeout=${BENCH_TIMEOUT:-600}
concurrency=${BENCH_CONCURRENCY:-16}
rate=${BENCH_RATE:-0}
muster=${CARGO_TARGET_DIR:-$root/target}/release/muster

log() { echo "bench-e2e: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
kc() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

features=()
[ "${BENCH_PROFILE:-}" = heaptrack ] && features=(--features system-allocator)
log "building muster (release${features:+, ${features[*]}})"
cargo build --release --quiet -p muster "${features[@]}" || die "cargo build --release failed"
[ -x "$muster" ] || die "$muster was not built"

# muster first, then the cluster (cluster-down also stops a muster marked with this folder).
muster_pid=
cleanup() {
  local rc=$?
  if [ -n "${profiler_pid:-}" ]; then
    kill -INT "$profiler_pid" 2> /dev/null || true
    for _ in $(seq 100); do kill -0 "$profiler_pid" 2> /dev/null || break; sleep 0.1; done
    log "profile in $dir/profile"
  fi
  if [ -n "$muster_pid" ] && kill -0 "$muster_pid" 2> /dev/null; then
    kill -TERM "$muster_pid" 2> /dev/null || true
    for _ in $(seq 50); do kill -0 "$muster_pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$muster_pid" 2> /dev/null || true
  fi
  MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" > /dev/null 2>&1 || log "WARNING: cluster-down failed for $dir"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh cluster every time: the bench refuses namespaces that hold pods of an earlier run.
MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" > /dev/null 2>&1 || true
log "control plane in $dir"
MUSTER_CLUSTER_DIR=$dir MUSTER_K8S_BIN=$bin bash "$root/hack/cluster-up.sh" > "$dir.cluster-up.log" 2>&1 \
  || { cat "$dir.cluster-up.log" >&2; die "cluster-up failed"; }
grep -E "^feature-gates|^dropped|ready in" "$dir.cluster-up.log" >&2 || true
for g in GenericWorkload WorkloadWithJob; do
  grep -q "^feature-gates.*$g=true" "$dir/features.txt" \
    || log "WARNING: gate $g is not on: the gang path's Jobs will not be gang scheduled"
done

if [ "${BENCH_HOSTILE:-}" = 1 ]; then
  kc create namespace bench-hostile --dry-run=client -o yaml | kc apply -f - > /dev/null
  kc apply -f - > /dev/null <<'YAML' || die "the API server refused the hostile MusterJob (no webhook runs yet)"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: absurd, namespace: bench-hostile}
spec:
  completionMode: Indexed
  parallelism: 50000000
  completions: 50000000
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: busybox, resources: {limits: {nvidia.com/gpu: "1"}}}]
YAML
  log "hostile MusterJob bench-hostile/absurd (50,000,000 pods) created before muster starts"
fi

read -r metrics_port webhook_port <<< "$(bash "$root/hack/free-ports.sh" 2)"
kc create namespace muster-system --dry-run=client -o yaml | kc apply -f - > /dev/null
mkdir -p "$dir/logs" "$dir/pids"
# MUSTER_CLUSTER_DIR in its environment marks it as this cluster's for cluster-down.
MUSTER_CLUSTER_DIR=$dir setsid "$muster" run --kubeconfig "$dir/kubeconfig" --namespace muster-system \
  --metrics-bind-address "127.0.0.1:$metrics_port" --webhook-bind-address "127.0.0.1:$webhook_port" \
  --webhook-url "https://127.0.0.1:$webhook_port" --webhook-manage-configurations=true \
  > "$dir/logs/muster.log" 2>&1 < /dev/null &
muster_pid=$!
echo "$muster_pid" > "$dir/pids/muster.pid"
ready=0
for _ in $(seq 300); do
  kill -0 "$muster_pid" 2> /dev/null || { tail -n 20 "$dir/logs/muster.log" >&2; die "muster exited"; }
  if curl -sf "http://127.0.0.1:$metrics_port/readyz" > /dev/null 2>&1 \
    && [ -n "$(kc get mutatingwebhookconfiguration muster-mutating -o jsonpath='{.webhooks[0].clientConfig.caBundle}' 2> /dev/null)" ]; then
    ready=1
    break
  fi
  sleep 0.2
done
[ $ready = 1 ] || { tail -n 20 "$dir/logs/muster.log" >&2; die "muster not ready after 60 s"; }
profiler_pid=
case "${BENCH_PROFILE:-}" in
  "") ;;
  perf)
    mkdir -p "$dir/profile"
    perf record -F 499 -g -p "$muster_pid" -o "$dir/profile/perf.data" > "$dir/profile/perf.log" 2>&1 &
    profiler_pid=$! ;;
  heaptrack)
    mkdir -p "$dir/profile"
    heaptrack -o "$dir/profile/heaptrack" -p "$muster_pid" > "$dir/profile/heaptrack.log" 2>&1 &
    profiler_pid=$! ;;
  *) die "BENCH_PROFILE must be perf or heaptrack" ;;
esac
log "muster ready (pid $muster_pid, metrics http://127.0.0.1:$metrics_port/metrics, log $dir/logs/muster.log)"

mkdir -p "$(dirname "$out")"
rc=0
"$muster" dev bench --kubeconfig "$dir/kubeconfig" --nodes "$nodes" --gangs "$gangs" --size "$size" \
  --paths "$paths" --muster-pid "$muster_pid" --muster-metrics-url "http://127.0.0.1:$metrics_port/metrics" \
  --concurrency "$concurrency" --rate "$rate" --timeout "$timeout" --json-out "$out" || rc=$?
kill -0 "$muster_pid" 2> /dev/null || { log "muster died during the bench:"; tail -n 20 "$dir/logs/muster.log" >&2; rc=1; }
if [ "${BENCH_HOSTILE:-}" = 1 ]; then
  log "hostile job: $(kc -n bench-hostile get musterjob absurd -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' 2>&1)"
  log "hostile job's pods: $(kc -n bench-hostile get pods --no-headers 2> /dev/null | wc -l)"
  log "muster's peak RSS: $(grep VmHWM "/proc/$muster_pid/status" 2> /dev/null || echo 'muster is gone')"
fi
[ $rc = 0 ] || log "the bench failed (exit $rc); logs in $dir/logs"
exit $rc
