#!/usr/bin/env bash
# What one write costs kube-apiserver, by kind (`make bench-writes`): starts a control plane of
# its own (hack/cluster-up.sh in target/writes-cluster, muster's CRDs installed, no muster
# running), makes WRITES_OBJECTS objects of each kind below, then WRITES_ROUNDS rounds of one
# write per object (8 at once, through `kubectl proxy`): a label change (merge patch), and for
# kinds with a status subresource a status of the shape muster writes, sent three ways: a merge
# patch (`status`), the same asking for an answer of the object's metadata only (`status-meta`:
# Accept `as=PartialObjectMetadata`, as muster's status writes ask), that with
# `fieldValidation=Ignore` too (`status-lean`: the API server decodes the patched object without
# looking for unknown or duplicate fields, which it does by default to warn), an update of the
# whole object as read before the round (`status-put`, fenced by its resourceVersion, as muster
# writes a plan, its clear and a MusterJob's status where its cache holds the object at that
# version) and a server-side apply (`status-apply`, as muster writes a MusterJob's status when
# its cache lags). Prints kube-apiserver's CPU
# milliseconds per write (its utime + stime over the round, divided by the writes; the median
# round, and every round), and per create (the objects of each kind made by one `kubectl create`
# of a list, one at a time, after 20 of every kind were made unmeasured). Each round starts at
# another case, so what one case leaves the next to pay (garbage collection) reaches all alike.
#
# Kinds: a MusterJob of bench-e2e's shape (3 one-GPU pods, gang of 3) and a PodGroup as muster
# compiles one for it, each also under a copy of its CRD without CEL rules (group
# norules.bench.muster.dev: what the rules cost, in creates, label patches, status merge patches
# and status updates), a Workload as muster compiles one for that
# MusterJob, a NodeGPUReport (a small custom resource, for the floor), a ConfigMap and a batch/v1
# Job of the same pod template (built in; suspended, so the Job controller makes no pods; label
# patches only: its controller owns its status).
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

# The MusterJob and PodGroup CRDs again, every x-kubernetes-validations rule removed, in another
# group (norules.bench.muster.dev): what their rules cost.
for crd in musterjobs.batch.muster.dev podgroups.scheduling.muster.dev; do
  kc get crd "$crd" -o json | crd_without_rules | python3 -c '
import json, sys
crd = json.load(sys.stdin)
spec = crd["spec"]
for v in spec["versions"]:
    v.pop("selectableFields", None)
spec["group"] = "norules.bench.muster.dev"
spec["names"].pop("categories", None)
spec["names"].pop("shortNames", None)
name = spec["names"]["plural"] + ".norules.bench.muster.dev"
print(json.dumps({"apiVersion": crd["apiVersion"], "kind": crd["kind"],
                  "metadata": {"name": name}, "spec": spec}))' > "$work/crd-$crd.json"
  # `create`, not `apply`: the CRD is over the size apply's last-applied annotation allows.
  kc create -f "$work/crd-$crd.json" > /dev/null
done
for plural in musterjobs podgroups; do
  for _ in $(seq 100); do kc get --raw "/apis/norules.bench.muster.dev/v1alpha1/$plural" > /dev/null 2>&1 && break; sleep 0.3; done
  kc get --raw "/apis/norules.bench.muster.dev/v1alpha1/$plural" > /dev/null || die "the CRD of $plural without rules is not served"
done
kc create namespace writes > /dev/null

python3 - "$objects" "$work" <<'PY'
import json, sys
n, work = int(sys.argv[1]), sys.argv[2]
WARM = 20
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
def pod_group(group, i):
    # As muster compiles one for a MusterJob: its Workload's template, gang of 3.
    return {"apiVersion": f"{group}/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": f"o{i:05d}", "namespace": "writes"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}, "disruptionMode": {"single": {}},
                     "priority": 0, "workloadRef": {"workloadName": f"o{i:05d}", "templateName": "main"}}}
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
    "podgroup": [pod_group("scheduling.muster.dev", i) for i in range(n)],
    "podgroup-norules": [pod_group("norules.bench.muster.dev", i) for i in range(n)],
    "nodegpureport": [{"apiVersion": "gpu.muster.dev/v1alpha1", "kind": "NodeGPUReport",
                       "metadata": {"name": f"o{i:05d}"}, "spec": {"gpus": 8, "pods": 0}} for i in range(n)],
    "configmap": [{"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": f"o{i:05d}", "namespace": "writes"}, "data": {"k": "v"}} for i in range(n)],
}
for kind, items in kinds.items():
    with open(f"{work}/{kind}.json", "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)
    # A few more of the kind (names w00000...), made before any is measured: the first objects
    # of a kind carry the API server's first-use costs of it.
    warm = json.loads(json.dumps(items[:WARM]))
    for i, item in enumerate(warm):
        item["metadata"]["name"] = f"w{i:05d}"
        if "podGroupTemplates" in item.get("spec", {}):
            item["spec"]["podGroupTemplates"][0]["name"] = f"w{i:05d}"
    with open(f"{work}/{kind}-warm.json", "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": warm}, f)
PY
pid=$(cat "$dir/pids/kube-apiserver.pid" 2> /dev/null || pgrep -f "kube-apiserver.*$dir" | head -1)
[ -r "/proc/$pid/stat" ] || die "kube-apiserver's process not found"
tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
# Every kind made, in the order they are made and printed.
kinds=(musterjob musterjob-norules job workload podgroup podgroup-norules nodegpureport configmap)

for kind in "${kinds[@]}"; do
  kc create -f "$work/$kind-warm.json" > /dev/null || die "creating the first ${kind}s failed"
done
sleep 2
declare -A created
for kind in "${kinds[@]}"; do
  before=$(cpu_ticks)
  kc create -f "$work/$kind.json" > /dev/null || die "creating the ${kind}s failed"
  after=$(cpu_ticks)
  created[$kind]=$(python3 -c "print(f'{($after - $before) / $tck * 1000 / $objects:.2f}')")
done

port=$(bash "$root/hack/free-ports.sh" 1)
# kubectl itself in the background, not the kc function: $! is then kubectl's pid, which the
# cleanup kills (a function's subshell killed would leave kubectl running).
"$bin/kubectl" --kubeconfig "$dir/kubeconfig" proxy --port "$port" > "$work/proxy.log" 2>&1 &
proxy=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" > /dev/null && break; sleep 0.2; done

# group KIND: the API group of a kind's objects (its rule-free twin's for KIND-norules).
group() {
  case $1 in
    *-norules) echo norules.bench.muster.dev ;;
    musterjob) echo batch.muster.dev ;;
    podgroup) echo scheduling.muster.dev ;;
    nodegpureport) echo gpu.muster.dev ;;
  esac
}

# url KIND: the object URL pattern (printf %05g for the index).
url() {
  case $1 in
    musterjob*) echo "apis/$(group "$1")/v1alpha1/namespaces/writes/musterjobs/o%05g" ;;
    podgroup*) echo "apis/$(group "$1")/v1alpha1/namespaces/writes/podgroups/o%05g" ;;
    nodegpureport) echo "apis/$(group "$1")/v1alpha1/nodegpureports/o%05g" ;;
    configmap) echo "api/v1/namespaces/writes/configmaps/o%05g" ;;
    job) echo "apis/batch/v1/namespaces/writes/jobs/o%05g" ;;
  esac
}

# status_body KIND N: a status of the shape muster writes (a MusterJob's live counts and phase,
# a PodGroup's counts and phase, each with one condition), N in a count so every round changes
# it; apiVersion and kind included, which an apply needs and a merge patch ignores.
status_body() {
  local kind=$1 n=$2
  case $kind in
    podgroup*)
      printf '{"apiVersion":"%s/v1alpha1","kind":"PodGroup","status":{"phase":"Running","pods":3,"admitted":3,"scheduled":3,"running":3,"gated":%d,"succeeded":0,"failed":0,"minCount":3,"observedGeneration":1,"conditions":[{"type":"Admitted","status":"True","reason":"Admitted","message":"placed 3 pod(s)","observedGeneration":1,"lastTransitionTime":"2026-12-07T07:05:59Z"}]}}' "$(group "$kind")" "$n" ;;
    musterjob*)
      printf '{"apiVersion":"%s/v1alpha1","kind":"MusterJob","status":{"phase":"Running","active":%d,"ready":3,"succeeded":0,"failed":0,"terminating":0,"progress":"0/3","observedGeneration":1,"startTime":"2026-12-07T07:05:58Z","conditions":[{"type":"Invalid","status":"False","reason":"Valid","message":"","observedGeneration":1,"lastTransitionTime":"2026-12-07T07:06:00Z"}]}}' "$(group "$kind")" "$n" ;;
  esac
}

# round KIND WRITE N: prints kube-apiserver's CPU ms per write of one round.
round() {
  local kind=$1 write=$2 n=$3 suffix= accept=application/json content=application/merge-patch+json query=
  case $write in
    label) printf '{"metadata":{"labels":{"bench.muster.dev/round":"r%d"}}}' "$n" > "$work/body.json" ;;
    status | status-meta | status-lean | status-apply)
      suffix=/status
      [ "$write" = status ] || accept="application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
      [ "$write" = status-lean ] && query="?fieldValidation=Ignore"
      if [ "$write" = status-apply ]; then
        content=application/apply-patch+yaml
        query="?fieldManager=bench&force=true"
      fi
      status_body "$kind" "$n" > "$work/body.json" ;;
  esac
  if [ "$write" = status-put ]; then
    put_round "$kind" "$n"
    return
  fi
  local before after failed
  before=$(cpu_ticks)
  failed=$(seq -f "http://127.0.0.1:$port/$(url "$kind")$suffix$query" 0 $((objects - 1)) \
    | xargs -P 8 -I{} sh -c 'curl -sf -o /dev/null -X PATCH -H "Content-Type: $4" -H "Accept: $3" --data-binary @"$1" "$2" || echo x' _ "$work/body.json" {} "$accept" "$content" \
    | wc -l)
  after=$(cpu_ticks)
  [ "$failed" -eq 0 ] || die "$failed of $objects $write writes of $kind failed"
  python3 -c "print(f'{($after - $before) / $tck * 1000 / $objects:.2f}')"
}

# put_round KIND N: prints kube-apiserver's CPU ms per write of one round of `status-put`: each
# object's status replaced by an update (PUT) of the whole object as read before the round
# (a list, not measured), the status of status_body in it, its resourceVersion as read (the
# fence), its managedFields left out (the API server keeps them: a cache stripped of them sends
# none), an answer of metadata only and fieldValidation=Ignore: what muster would send if it
# replaced a status it holds whole instead of patching it.
put_round() {
  local kind=$1 n=$2 before after failed
  local base
  base=http://127.0.0.1:$port/$(url "$kind")
  base=${base%/o%05g}
  rm -rf "$work/put" && mkdir -p "$work/put"
  curl -sf "$base" > "$work/put/list.json" || die "listing the ${kind}s failed"
  status_body "$kind" "$n" > "$work/body.json"
  python3 - "$work/put" "$work/body.json" <<'PY' || die "preparing the updates of ${kind}s failed"
import json, sys
out, body = sys.argv[1], json.load(open(sys.argv[2]))
for item in json.load(open(f"{out}/list.json"))["items"]:
    name = item["metadata"]["name"]
    if not name.startswith("o"):
        continue
    item["metadata"].pop("managedFields", None)
    item["status"] = body["status"]
    with open(f"{out}/{name}.json", "w") as f:
        json.dump(item, f)
PY
  before=$(cpu_ticks)
  failed=$(seq -f "%05g" 0 $((objects - 1)) \
    | xargs -P 8 -I{} sh -c 'curl -sf -o /dev/null -X PUT -H "Content-Type: application/json" -H "Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1" --data-binary @"$1/o$3.json" "$2/o$3/status?fieldValidation=Ignore" || echo x' _ "$work/put" "$base" {} \
    | wc -l)
  after=$(cpu_ticks)
  [ "$failed" -eq 0 ] || die "$failed of $objects status-put writes of $kind failed"
  python3 -c "print(f'{($after - $before) / $tck * 1000 / $objects:.2f}')"
}

# The rounds go over every kind in turn, so a drift of the machine reaches all alike.
cases=()
for write in label status status-meta status-lean status-put status-apply; do
  for kind in "${kinds[@]}"; do
    # A Workload is only created: muster writes neither its labels nor a status.
    [ "$kind" = workload ] && continue
    [ "$write" != label ] && case $kind in job | nodegpureport | configmap) continue ;; esac
    # The rule-free twins: their creates, label patches, status merge patches and updates (the
    # write muster sends), so what the rules cost shows under both ways of writing a status.
    case $write in status-meta | status-lean | status-apply) case $kind in *-norules) continue ;; esac ;; esac
    cases+=("$kind/$write")
  done
done
declare -A results
# Each round starts one case further on: a case measured right after a costlier one may pay
# some of its garbage collection, and the rotation spreads that over every case.
for n in $(seq "$rounds"); do
  for i in $(seq 0 $((${#cases[@]} - 1))); do
    c=${cases[$(((i + n - 1) % ${#cases[@]}))]}
    results[$c]+="$(round "${c%/*}" "${c#*/}" "$n") "
  done
done
printf '%-18s %-7s %9s   %s\n' kind write "ms/write" "each round (ms/write)"
for kind in "${kinds[@]}"; do
  printf '%-18s %-7s %9s   %s\n' "$kind" create "${created[$kind]}" "(one kubectl create of $objects)"
done
for c in "${cases[@]}"; do
  median=$(printf '%s\n' ${results[$c]} | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  printf '%-18s %-7s %9s   %s\n' "${c%/*}" "${c#*/}" "$median" "${results[$c]}"
done
