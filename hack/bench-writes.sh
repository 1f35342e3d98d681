#!/usr/bin/env bash
# What one write costs kube-apiserver, by kind (`make bench-writes`): starts a control plane of
# its own (hack/cluster-up.sh in target/writes-cluster, muster's CRDs installed, no muster
# running), makes WRITES_OBJECTS objects of each kind below, then WRITES_ROUNDS rounds of one
# merge patch per object (8 at once, through `kubectl proxy`): a label change, and for kinds with
# a status subresource a status change, sent again asking for an answer of the object's metadata
# only (`status-meta`: Accept `as=PartialObjectMetadata`, as muster's status writes ask). Prints
# kube-apiserver's CPU milliseconds per write (its
# utime + stime over the round, divided by the writes; the median round, and the spread), and
# per create (the objects of each kind made by one `kubectl create` of a list, one at a time).
#
# Kinds: a MusterJob of bench-e2e's shape (3 one-GPU pods, gang of 3), the same MusterJob under
# a copy of its CRD without CEL rules (group norules.bench.muster.dev: what the rules cost), a
# PodGroup, a Workload as muster compiles one for that MusterJob, a NodeGPUReport (a small custom
# resource, for the floor), a ConfigMap and a batch/v1 Job of the same pod template (built in;
# suspended, so the Job controller makes no pods; label patches only: its controller owns its
# status).
#
#   WRITES_OBJECTS (400)  WRITES_ROUNDS (5)  MUSTER_CLUSTER_DIR (target/writes-cluster)
#   MUSTER_K8S_BIN (tools/k8s/bindir.sh)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. "$root/hack/bench-lib.sh"
bench_setup bench-writes "$root/target/writes-cluster"
objects=${WRITES_OBJECTS:-400}
rounds=${WRITES_ROUNDS:-5}
[[ $objects =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ ]] || die "WRITES_OBJECTS and WRITES_ROUNDS are positive counts"

proxy=
cleanup() {
  local rc=$?
  [ -n "$proxy" ] && kill "$proxy" 2> /dev/null || true
  bench_cluster_down || log "WARNING: cluster-down failed for $dir"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bench_cluster_up
kc() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
work=$dir/writes
mkdir -p "$work"

# The MusterJob CRD again, every x-kubernetes-validations rule removed, in another group.
kc get crd musterjobs.batch.muster.dev -o json | python3 -c '
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
spec = crd["spec"]
strip(spec["versions"])
for v in spec["versions"]:
    v.pop("selectableFields", None)
spec["group"] = "norules.bench.muster.dev"
print(json.dumps({"apiVersion": crd["apiVersion"], "kind": crd["kind"],
                  "metadata": {"name": "musterjobs.norules.bench.muster.dev"}, "spec": spec}))' > "$work/crd.json"
# `create`, not `apply`: the CRD is over the size apply's last-applied annotation allows.
kc create -f "$work/crd.json" > /dev/null
for _ in $(seq 100); do kc get --raw /apis/norules.bench.muster.dev/v1alpha1 > /dev/null 2>&1 && break; sleep 0.3; done
kc get --raw /apis/norules.bench.muster.dev/v1alpha1 > /dev/null || die "the CRD without rules is not served"
kc create namespace writes > /dev/null

python3 - "$objects" "$work" <<'PY'
import json, sys
n, work = int(sys.argv[1]), sys.argv[2]
gpu = {"nvidia.com/gpu": "1", "cpu": "100m", "memory": "128Mi"}
template = {"metadata": {"labels": {"bench.muster.dev/pod": "true"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "worker", "image": "muster-bench",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}
def job(group, i):
    return {"apiVersion": f"{group}/v1alpha1", "kind": "MusterJob",
            "metadata": {"name": f"o{i:05d}", "namespace": "writes"},
            "spec": {"parallelism": 3, "completions": 3, "template": template,
                     "scheduling": {"schedulingPolicy": {"gang": {"minCount": 3}}}}}
def batch_job(i):
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"o{i:05d}", "namespace": "writes"},
            "spec": {"parallelism": 3, "completions": 3, "suspend": True, "template": template}}
kinds = {
    "musterjob": [job("batch.muster.dev", i) for i in range(n)],
    "job": [batch_job(i) for i in range(n)],
    "workload": [{"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "Workload",
                  "metadata": {"name": f"o{i:05d}", "namespace": "writes"},
                  "spec": {"podGroupTemplates": [{"name": f"o{i:05d}",
                                                  "schedulingPolicy": {"gang": {"minCount": 3}}}]}}
                 for i in range(n)],
    "musterjob-norules": [job("norules.bench.muster.dev", i) for i in range(n)],
    "podgroup": [{"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
                  "metadata": {"name": f"o{i:05d}", "namespace": "writes"},
                  "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}} for i in range(n)],
    "nodegpureport": [{"apiVersion": "gpu.muster.dev/v1alpha1", "kind": "NodeGPUReport",
                       "metadata": {"name": f"o{i:05d}"}, "spec": {"gpus": 8, "pods": 0}} for i in range(n)],
    "configmap": [{"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": f"o{i:05d}", "namespace": "writes"}, "data": {"k": "v"}} for i in range(n)],
}
for kind, items in kinds.items():
    with open(f"{work}/{kind}.json", "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)
PY
pid=$(cat "$dir/pids/kube-apiserver.pid" 2> /dev/null || pgrep -f "kube-apiserver.*$dir" | head -1)
[ -r "/proc/$pid/stat" ] || die "kube-apiserver's process not found"
tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }

declare -A created
for kind in musterjob musterjob-norules job workload podgroup nodegpureport configmap; do
  before=$(cpu_ticks)
  kc create -f "$work/$kind.json" > /dev/null || die "creating the ${kind}s failed"
  after=$(cpu_ticks)
  created[$kind]=$(python3 -c "print(f'{($after - $before) / $tck * 1000 / $objects:.2f}')")
done

port=$(bash "$root/hack/free-ports.sh" 1)
kc proxy --port "$port" > "$work/proxy.log" 2>&1 &
proxy=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" > /dev/null && break; sleep 0.2; done

# url KIND: the object URL pattern (printf %05g for the index).
url() {
  case $1 in
    musterjob) echo "apis/batch.muster.dev/v1alpha1/namespaces/writes/musterjobs/o%05g" ;;
    musterjob-norules) echo "apis/norules.bench.muster.dev/v1alpha1/namespaces/writes/musterjobs/o%05g" ;;
    podgroup) echo "apis/scheduling.muster.dev/v1alpha1/namespaces/writes/podgroups/o%05g" ;;
    nodegpureport) echo "apis/gpu.muster.dev/v1alpha1/nodegpureports/o%05g" ;;
    configmap) echo "api/v1/namespaces/writes/configmaps/o%05g" ;;
    job) echo "apis/batch/v1/namespaces/writes/jobs/o%05g" ;;
  esac
}

# round KIND WRITE N: prints kube-apiserver's CPU ms per write of one round.
round() {
  local kind=$1 write=$2 n=$3 suffix= accept=application/json
  case $write in
    label) printf '{"metadata":{"labels":{"bench.muster.dev/round":"r%d"}}}' "$n" > "$work/body.json" ;;
    status | status-meta)
      suffix=/status
      [ "$write" = status ] || accept="application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
      case $kind in
        podgroup) printf '{"status":{"pods":%d,"gated":%d}}' "$n" "$n" > "$work/body.json" ;;
        *) printf '{"status":{"active":%d,"ready":0}}' "$n" > "$work/body.json" ;;
      esac ;;
  esac
  local before after failed
  before=$(cpu_ticks)
  failed=$(seq -f "http://127.0.0.1:$port/$(url "$kind")$suffix" 0 $((objects - 1)) \
    | xargs -P 8 -I{} sh -c 'curl -sf -o /dev/null -X PATCH -H "Content-Type: application/merge-patch+json" -H "Accept: $3" --data-binary @"$1" "$2" || echo x' _ "$work/body.json" {} "$accept" \
    | wc -l)
  after=$(cpu_ticks)
  [ "$failed" -eq 0 ] || die "$failed of $objects $write writes of $kind failed"
  python3 -c "print(f'{($after - $before) / $tck * 1000 / $objects:.2f}')"
}

# The rounds go over every kind in turn, so a drift of the machine reaches all alike.
cases=()
for write in label status status-meta; do
  for kind in musterjob musterjob-norules job podgroup nodegpureport configmap; do
    [ "$write" != label ] && case $kind in job | nodegpureport | configmap) continue ;; esac
    [ "$write" = status-meta ] && [ "$kind" = musterjob-norules ] && continue
    cases+=("$kind/$write")
  done
done
declare -A results
for n in $(seq "$rounds"); do
  for c in "${cases[@]}"; do results[$c]+="$(round "${c%/*}" "${c#*/}" "$n") "; done
done
printf '%-18s %-7s %9s   %s\n' kind write "ms/write" "each round (ms/write)"
for kind in musterjob musterjob-norules job workload podgroup nodegpureport configmap; do
  printf '%-18s %-7s %9s   %s\n' "$kind" create "${created[$kind]}" "(one kubectl create of $objects)"
done
for c in "${cases[@]}"; do
  median=$(printf '%s\n' ${results[$c]} | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  printf '%-18s %-7s %9s   %s\n' "${c%/*}" "${c#*/}" "$median" "${results[$c]}"
done
