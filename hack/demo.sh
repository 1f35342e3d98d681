#!/usr/bin/env bash
# make demo: from a fresh clone to a local GPU cluster running muster end to end.
#   hack/demo.sh          build what is missing, start the cluster and muster, apply examples/,
#                         wait, print what a user would look at, and leave it all running
#   hack/demo.sh --check  the same, non-interactively; exit 0 only when every promise holds,
#                         then stop it all (MUSTER_DEMO_KEEP=1 keeps it running)
#   hack/demo.sh --down   stop muster and the cluster
# MUSTER_DEMO_DIR (default target/demo) holds the cluster, muster's log and pid.
# MUSTER_DEMO_PROFILE=release (default) or debug picks the muster build.
# MUSTER_DEMO_MODE=muster (default) or upstream (`make demo MODE=upstream`): upstream turns the
# native workload-scheduling gates on, runs muster with --scheduling-api=upstream and shows the
# same examples admitted by kube-scheduler (the bring-your-own example in its native form,
# examples/upstream/).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${MUSTER_DEMO_DIR:-$root/target/demo}
profile=${MUSTER_DEMO_PROFILE:-release}
mode=${1:-run}
api=${MUSTER_DEMO_MODE:-muster}
case $api in muster | upstream) ;; *) echo "demo: MODE must be muster or upstream, not '$api'" >&2; exit 2 ;; esac
began=$SECONDS

step() { printf '\n\033[1m==> %s\033[0m (%ss)\n' "$*" "$((SECONDS - began))"; }
die() { echo "demo: ERROR: $*" >&2; exit 1; }

# Runs "$@" and, while it runs, prints a line every 20 s with the time spent: the first release
# build takes minutes and must not look hung (in a terminal or in a log). The heartbeat is
# stopped here, or stops itself within a second once this script is gone (a failure, Ctrl-C).
with_heartbeat() {
  local what=$1 t0=$SECONDS rc=0 beat
  shift
  (
    next=$((t0 + 20))
    while sleep 1 > /dev/null 2>&1 && kill -0 $$ 2> /dev/null; do
      [ $SECONDS -lt $next ] || { echo "  still $what, $((SECONDS - t0))s"; next=$((next + 20)); }
    done
  ) &
  beat=$!
  "$@" || rc=$?
  kill "$beat" 2> /dev/null || true
  wait "$beat" 2> /dev/null || true
  return $rc
}

stop_muster() {
  if [ -f "$dir/muster.pid" ]; then
    local pid
    pid=$(< "$dir/muster.pid")
    if kill -0 "$pid" 2> /dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "muster run"; then
      kill -TERM "$pid" 2> /dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2> /dev/null || true
    fi
    rm -f "$dir/muster.pid"
  fi
}

down() {
  stop_muster
  [ -d "$dir" ] && MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" || true
}

if [ "$mode" = "--down" ]; then
  down
  exit 0
fi

step "control plane binaries (built once per machine, cached)"
bin=$(bash "$root/tools/k8s/build.sh")
kc() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

step "muster ($profile build)"
if [ "$profile" = release ]; then
  with_heartbeat "building muster in release mode (minutes the first time)" cargo build --release --quiet
else
  with_heartbeat "building muster (debug)" cargo build --quiet
fi
muster=${CARGO_TARGET_DIR:-$root/target}/$profile/muster
[ -x "$muster" ] || die "$muster was not built"

step "local cluster in $dir ($api mode)"
if [ "$api" = upstream ]; then
  # The upstream workload-scheduling gates on (cluster-up's defaults): kube-scheduler admits
  # the gangs from the native Workload, PodGroup and CompositePodGroup muster compiles.
  MUSTER_CLUSTER_DIR=$dir MUSTER_K8S_BIN=$bin bash "$root/hack/cluster-up.sh" > "$dir.cluster-up.log" 2>&1 \
    || { cat "$dir.cluster-up.log"; die "cluster-up failed"; }
else
  # The upstream workload-scheduling gates stay off here, as on most clusters today, so
  # `kubectl get podgroups` means muster's PodGroups.
  MUSTER_CLUSTER_DIR=$dir MUSTER_K8S_BIN=$bin MUSTER_FEATURE_GATES= MUSTER_RUNTIME_CONFIG= \
    bash "$root/hack/cluster-up.sh" > "$dir.cluster-up.log" 2>&1 || { cat "$dir.cluster-up.log"; die "cluster-up failed"; }
fi
grep -m1 "ready in" "$dir.cluster-up.log" || true
export KUBECONFIG=$dir/kubeconfig

step "16 kwok GPU nodes: 8 NVSwitch + 8 PCIe, 8 GPUs each, two racks"
"$muster" dev add-nodes --count 8 --prefix gpu-nvs- --topology nvswitch --racks 2 | tail -n 1
"$muster" dev add-nodes --count 8 --prefix gpu-pcie- --topology pcie --racks 2 --gpu-product NVIDIA-L40S | tail -n 1

step "muster: controllers (leader election on) and admission webhooks"
stop_muster
read -r metrics_port webhook_port <<< "$(bash "$root/hack/free-ports.sh" 2)"
kc create namespace muster-system --dry-run=client -o yaml | kc apply -f - > /dev/null
mkdir -p "$dir/logs"
setsid "$muster" run --kubeconfig "$dir/kubeconfig" --namespace muster-system --leader-elect=true \
  --metrics-bind-address "127.0.0.1:$metrics_port" --webhook-bind-address "127.0.0.1:$webhook_port" \
  --webhook-url "https://127.0.0.1:$webhook_port" --webhook-manage-configurations=true \
  --scheduling-api="$api" > "$dir/logs/muster.log" 2>&1 < /dev/null &
echo $! > "$dir/muster.pid"
printf 'METRICS=http://127.0.0.1:%s/metrics\nWEBHOOK=https://127.0.0.1:%s\n' "$metrics_port" "$webhook_port" > "$dir/muster.env"
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$metrics_port/readyz" > /dev/null 2>&1 \
    && [ -n "$(kc get mutatingwebhookconfiguration muster-mutating -o jsonpath='{.webhooks[0].clientConfig.caBundle}' 2> /dev/null)" ] && break
  kill -0 "$(< "$dir/muster.pid")" 2> /dev/null || { tail -n 20 "$dir/logs/muster.log"; die "muster exited"; }
  sleep 0.2
done
echo "muster is up: log $dir/logs/muster.log, metrics http://127.0.0.1:$metrics_port/metrics"

# The examples: every one in examples/; in upstream mode the bring-your-own one in its native
# form (examples/upstream/) instead of muster's.
examples=()
for f in "$root"/examples/*.yaml; do
  [ "$api" = upstream ] && [ -f "$root/examples/upstream/${f##*/}" ] && f=$root/examples/upstream/${f##*/}
  examples+=(-f "$f")
done
step "applying examples/"
# Retried for up to 20 s: the webhook may still be starting, and for a few seconds after the
# CRDs first appear the API server answers 503 until its MutatingAdmissionPolicy can type them.
for _ in $(seq 20); do
  kc apply "${examples[@]}" && break
  echo "(retrying: the webhook may still be starting, or the API server reading the new CRDs)"; sleep 1
done

# The brought Job (finetune) and JobSet (pytorch-ddp) must also finish as batch/v1 and JobSet
# say it (their pods succeed after 15 s on kwok), the set with its headless Service and its
# coordinator's DNS name on every child and pod.
expect=(--admitted hello,train-2x4,inference,kv-cache,ray-train-driver-0,ray-train-workers-0,finetune,pytorch-ddp-leader-0,pytorch-ddp-workers-0
        --admitted-composite ray-train,pytorch-ddp --unschedulable too-big --api "$api"
        --complete finetune --completed-sets pytorch-ddp)
step "waiting for the gangs"
ok=0
for _ in $(seq 60); do
  if line=$("$muster" dev demo-check --summary "${expect[@]}" 2>&1); then ok=1; echo "  $line"; break; fi
  echo "  $line"
  sleep 2
done

step "what a user sees"
if [ "$api" = upstream ]; then
  # With the gates on, `podgroups` and `compositepodgroups` resolve to the native kinds.
  echo "\$ kubectl get musterjobs,musterjobsets -o wide; kubectl get podgroups,compositepodgroups"
  kc get musterjobs,musterjobsets -o wide
  echo
  kc get podgroups,compositepodgroups
else
  echo "\$ kubectl get musterjobs,musterjobsets,podgroups,compositepodgroups"
  kc get musterjobs,musterjobsets,podgroups,compositepodgroups
fi
echo
# A pod's group: muster's label, or (upstream mode) the native spec.schedulingGroup.
group_column='.metadata.labels.scheduling\.muster\.dev/pod-group'
[ "$api" = upstream ] && group_column=.spec.schedulingGroup.podGroupName
echo "\$ kubectl get pods -o custom-columns=POD:...,NODE:...,GPUS:...   (admitted pods, their node and GPU indices)"
kc get pods --field-selector=status.phase!=Pending -o \
  custom-columns="POD:.metadata.name,PODGROUP:$group_column,NODE:.spec.nodeName,GPUS:.metadata.annotations.gpu\\.muster\\.dev/indices,PHASE:.status.phase" \
  --sort-by=.spec.nodeName
echo
echo "\$ kubectl get service pytorch-ddp; kubectl get pods -l jobset.sigs.k8s.io/coordinator -o custom-columns=...   (the set's DNS names)"
kc get service pytorch-ddp || true
kc get pods -l jobset.sigs.k8s.io/coordinator --sort-by=.metadata.name -o \
  custom-columns='POD:.metadata.name,HOSTNAME:.spec.hostname,SUBDOMAIN:.spec.subdomain,COORDINATOR:.metadata.labels.jobset\.sigs\.k8s\.io/coordinator,PHASE:.status.phase' || true
echo
if [ "$api" = upstream ]; then
  echo "\$ kubectl get musterjob too-big -o jsonpath='{.status.conditions[?(@.type==\"PodGroupInitiallyScheduled\")].message}'"
  kc get musterjob too-big -o jsonpath='{.status.conditions[?(@.type=="PodGroupInitiallyScheduled")].message}{"\n"}'
else
  echo "\$ kubectl get podgroup too-big -o jsonpath='{.status.message}'"
  kc get podgroup too-big -o jsonpath='{.status.message}{"\n"}'
fi
echo
"$muster" dev demo-check "${expect[@]}" || ok=0

cat << USAGE

The cluster and muster keep running ($((SECONDS - began))s so far).
  export KUBECONFIG=$dir/kubeconfig PATH="$bin:\$PATH"
  kubectl get podgroups -w                       # where each gang stands, and why
  kubectl apply -f my-job.yaml                   # your own MusterJob / MusterJobSet (a Job or JobSet
                                                 # with its kind changed: docs/src/tasks/migrate.md)
  $muster validate -f my-job.yaml   # check a manifest offline first
  tail -f $dir/logs/muster.log
  make demo-down                                 # stop it all
USAGE

if [ "$mode" = "--check" ]; then
  [ "${MUSTER_DEMO_KEEP:-0}" = 1 ] || down > /dev/null
  [ $ok = 1 ] || die "the demo's promises do not hold (see above)"
  echo "demo-check: every promise holds"
fi
[ $ok = 1 ] || die "not every gang reached its expected state in time (see above and $dir/logs/muster.log)"
