#!/usr/bin/env bash
# The side-by-side scale benchmark (`make bench-e2e`): builds muster in release, starts a control
# plane of its own (hack/cluster-up.sh in target/bench-cluster, upstream GenericWorkload and
# WorkloadWithJob on), runs `muster run` against it, then `muster dev bench`: N kwok GPU nodes,
# then the same G gangs of S one-GPU pods as plain Jobs, upstream gang Jobs and MusterJobs, one
# path after the other. Prints the table and writes the numbers as JSON, then the events of each
# path's namespace by component and reason. Everything it started is stopped on exit.
#
#   BENCH_NODES (1000)  BENCH_GANGS (200)  BENCH_SIZE (3)  BENCH_PATHS (plain,gang,muster,muster-upstream)
#   BENCH_OUT (target/bench-e2e.json)  BENCH_TIMEOUT (600 s per path)  BENCH_CONCURRENCY (16)
#   BENCH_RATE (gangs created per second per path; 0, the default: as fast as creates go)
#   BENCH_KWOK_HEARTBEAT (0,600): MIN,MAX seconds between a kwok node's condition refreshes
#   (hack/cluster-up.sh's MUSTER_KWOK_HEARTBEAT; 300,360 is the test clusters' setting)
#   BENCH_SETTLE (120): after a path's last bind, wait up to this many seconds for the API
#   server's writes to quiet down before the next path (its tail reported apart); 0: no wait
#   BENCH_CLEAN=1: after each path, delete its namespace and wait until it is gone and the API
#   server quiet, so every path starts on a cluster of nodes alone (default: paths pile up)
#   BENCH_FRESH=1: every path on a control plane of its own, started afresh for it (the script
#   once per path), the paths' reports then related to the plain path (`muster dev bench --merge`)
#   BENCH_PROFILE=perf|heaptrack|apiserver|scheduler: record muster's CPU samples (perf record) or
#   its heap (heaptrack attached; muster is then built with the system allocator, which heaptrack
#   sees) during the whole run, or kube-apiserver's or kube-scheduler's CPU (their own profiler;
#   kube-scheduler's /debug/pprof and /metrics then open to anonymous requests on 127.0.0.1) for
#   20 s of each path from 5 s after its first pod (BENCH_PROFILE_SECONDS, BENCH_PROFILE_DELAY),
#   into $MUSTER_CLUSTER_DIR/profile/ (<component>-<path>.pprof: `go tool pprof -top -cum FILE`;
#   for scheduler also its /metrics at each profile's start and end, <path>.metrics-{0,1})
#   BENCH_HOSTILE=1: before muster starts (so no webhook refuses it), a tenant's MusterJob of
#   50,000,000 Indexed pods is created in namespace bench-hostile: muster must run the paths
#   beside it with its memory bounded (the job is Invalid, no pod of it is made); its status and
#   the pods of that namespace are printed at the end
#   BENCH_CRD_RULES=0 or =GROUP: a measurement, not a setup to run: muster's CRDs (0) or those of
#   one API group (e.g. scheduling.muster.dev) served with every x-kubernetes-validations rule
#   removed (replaced once the control plane is up, before muster starts), to see what the rules
#   cost the API server at scale (it evaluates every rule of an object again on each status write)
#   BENCH_APF=chart|none (chart): muster runs as the chart's ServiceAccount (`helm template` of
#   charts/muster, release muster in muster-system: its ServiceAccount, ClusterRoles, Roles,
#   bindings and ValidatingAdmissionPolicies applied as admin, not its Deployment, Services or
#   webhook configurations), with a TokenRequest token, so API Priority and Fairness applies as
#   in production (admin is exempt). chart: the chart's FlowSchema too; none: without it (muster
#   falls to the built-in service-accounts FlowSchema, workload-low). muster manages its own
#   webhook configurations as before; the one right that needs beyond the chart's RBAC is the
#   bench-only ClusterRole muster-bench-webhook-configurations (get/create/patch of the two, and
#   of the MutatingAdmissionPolicy muster-scheduling-api and its binding).
#   An ordinary user, ServiceAccount bench-user with ConfigMap rights in namespace bench-user, creates a
#   ConfigMap every second during each path (muster dev bench --user-kubeconfig).
#   BENCH_USER_INTERVAL_MS (1000): milliseconds between the user's creates (50 to 60000); shorter
#   gives each path's user p99 more samples than its one or two slowest requests
#   MUSTER_CLUSTER_DIR (target/bench-cluster)  MUSTER_K8S_BIN (tools/k8s/bindir.sh)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. "$root/hack/bench-lib.sh"
bench_setup bench-e2e "$root/target/bench-cluster"
nodes=${BENCH_NODES:-1000}
gangs=${BENCH_GANGS:-200}
size=${BENCH_SIZE:-3}
paths=${BENCH_PATHS:-plain,gang,muster,muster-upstream}
out=${BENCH_OUT:-$root/target/bench-e2e.json}
timeout=${BENCH_TIMEOUT:-600}
concurrency=${BENCH_CONCURRENCY:-16}
rate=${BENCH_RATE:-0}
settle=${BENCH_SETTLE:-120}
clean=()
[ "${BENCH_CLEAN:-0}" = 1 ] && clean=(--clean-between)
apf=${BENCH_APF:-chart}
case "$apf" in chart | none) ;; *) echo "bench-e2e: BENCH_APF must be chart or none" >&2; exit 2 ;; esac

kc() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

features=()
[ "${BENCH_PROFILE:-}" = heaptrack ] && features=(--features system-allocator)
bench_build "${features[@]}"

# BENCH_FRESH=1: every path on a control plane of its own, started afresh (this script once per
# path, that path alone, its report beside BENCH_OUT as <name>.<path>.json), then the reports
# joined and related to the plain path (`muster dev bench --merge`). No path then runs on what
# an earlier one left (its pods, its objects' history in etcd, the API server's and kwok's and
# muster's grown state): in the default order the muster paths run third and fourth.
if [ "${BENCH_FRESH:-0}" = 1 ]; then
  rc=0
  parts=()
  IFS=, read -ra each <<< "$paths"
  for p in "${each[@]}"; do
    part="${out%.json}.$p.json"
    rm -f "$part"
    log "path $p on a control plane of its own"
    BENCH_FRESH=0 BENCH_PATHS=$p BENCH_OUT=$part bash "$0" || rc=$?
    [ -f "$part" ] && parts+=("$part")
  done
  [ ${#parts[@]} -gt 0 ] || die "no path wrote a report"
  "$muster" dev bench --merge "${parts[@]}" --json-out "$out" || rc=$?
  exit $rc
fi

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
  bench_cluster_down || log "WARNING: cluster-down failed for $dir"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh cluster every time: the bench refuses namespaces that hold pods of an earlier run.
# API Priority and Fairness on, with kube-apiserver's default seats (hack/cluster-up.sh turns it
# off for the tests; the last of a repeated flag wins).
apf_args="--enable-priority-and-fairness=true --max-requests-inflight=400 --max-mutating-requests-inflight=200"
# kwok refreshes each node's conditions (a Node status write) every 300 to 360 s by default:
# the 5,000 nodes made at once would all refresh within one minute, landing on whichever path
# runs then (up to 3,900 Node writes in one path). Spread over 0 to 600 s, every path sees the
# same steady rate, as the kubelets of a real cluster, which started at different times, make it.
[ "${BENCH_PROFILE:-}" = apiserver ] && apf_args="$apf_args --profiling=true"
sched_args=
[ "${BENCH_PROFILE:-}" = scheduler ] \
  && sched_args="--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*"
MUSTER_KWOK_HEARTBEAT=${BENCH_KWOK_HEARTBEAT:-0,600} \
  MUSTER_APISERVER_EXTRA_ARGS="$apf_args ${MUSTER_APISERVER_EXTRA_ARGS:-}" \
  MUSTER_SCHEDULER_EXTRA_ARGS="$sched_args ${MUSTER_SCHEDULER_EXTRA_ARGS:-}" bench_cluster_up
grep -E "^feature-gates|^dropped|ready in" "$dir.cluster-up.log" >&2 || true
crd_rules=${BENCH_CRD_RULES:-1}
if [ "$crd_rules" != 1 ]; then
  case "$crd_rules" in
    0) stripped='muster\.dev$' ;;
    *.muster.dev) stripped="\\.${crd_rules//./\\.}\$" ;;
    *) die "BENCH_CRD_RULES must be 1, 0 or an API group of muster's (e.g. scheduling.muster.dev)" ;;
  esac
  crds=$(kc get crd -o name | grep -E "$stripped") || die "BENCH_CRD_RULES=$crd_rules: no CRD matches"
  for crd in $crds; do
    kc get "$crd" -o json | crd_without_rules | kc replace -f - > /dev/null || die "cannot replace $crd without its rules"
  done
  # shellcheck disable=SC2086 # one name per word
  kc wait --for=condition=Established --timeout=60s $crds > /dev/null || die "the CRDs without their rules are not established"
  # shellcheck disable=SC2086
  left=$(kc get $crds -o json | grep -c 'x-kubernetes-validations' || true)
  [ "$left" = 0 ] || die "BENCH_CRD_RULES=$crd_rules: rules left in $crds"
  log "BENCH_CRD_RULES=$crd_rules: served without their CEL rules (a measurement only): $(echo $crds | tr '\n' ' ')"
fi
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

# A kubeconfig NAME in $dir that authenticates with a TokenRequest token of ServiceAccount SA in NS.
token_kubeconfig() {
  local name=$1 ns=$2 sa=$3 token server ca
  token=$(kc -n "$ns" create token "$sa" --duration=12h) || die "no token for $ns/$sa"
  server=$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
  cat > "$dir/$name" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: bench, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: $sa, user: {token: "$token"}}]
contexts: [{name: $sa, context: {cluster: bench, user: $sa}}]
current-context: $sa
KUBECONFIG
  chmod 600 "$dir/$name"
}

# The FlowSchema and priority level the API server classifies a request of KUBECONFIG under (the
# response headers X-Kubernetes-PF-*-UID, by name; "exempt" without them).
apf_of() {
  local token server headers fs pl
  token=$("$bin/kubectl" --kubeconfig "$1" config view --raw --minify -o jsonpath='{.users[0].user.token}')
  server=$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
  headers=$(curl -sk -o /dev/null -D - -H "Authorization: Bearer $token" "$server/version" | tr -d '\r')
  fs=$(sed -n 's/^[Xx]-[Kk]ubernetes-[Pp][Ff]-[Ff]low[Ss]chema-[Uu][Ii][Dd]: *//p' <<< "$headers")
  pl=$(sed -n 's/^[Xx]-[Kk]ubernetes-[Pp][Ff]-[Pp]riority[Ll]evel-[Uu][Ii][Dd]: *//p' <<< "$headers")
  [ -n "$fs" ] || { echo "exempt (no X-Kubernetes-PF-FlowSchema-UID)"; return; }
  fs=$(kc get flowschemas -o jsonpath="{range .items[?(@.metadata.uid==\"$fs\")]}{.metadata.name}{end}")
  pl=$(kc get prioritylevelconfigurations -o jsonpath="{range .items[?(@.metadata.uid==\"$pl\")]}{.metadata.name}{end}")
  echo "FlowSchema $fs, priority level $pl"
}

# The chart's objects muster's pod would run with, as admin: not its Deployment, Services or
# webhook configurations (muster on this machine manages its own, as before).
apf_set=(--set apf.enabled=true)
[ "$apf" = none ] && apf_set=(--set apf.enabled=false)
mkdir -p "$dir/helm"
HELM_CACHE_HOME=$dir/helm/cache HELM_CONFIG_HOME=$dir/helm/config HELM_DATA_HOME=$dir/helm/data \
  "$bin/helm" template muster "$root/charts/muster" --namespace muster-system --set replicaCount=0 "${apf_set[@]}" \
  > "$dir/chart.yaml" || die "helm template failed"
python3 - "$dir/chart.yaml" > "$dir/chart-applied.yaml" <<'PY' || die "filtering the chart's objects failed"
import re, sys
kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "FlowSchema",
         "PriorityLevelConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
docs = re.split(r"^---\s*$", open(sys.argv[1]).read(), flags=re.M)
kept = [d for d in docs if (m := re.search(r"^kind: *(\S+)", d, flags=re.M)) and m.group(1) in kinds]
print("\n---\n".join(kept))
PY
kc apply --server-side --field-manager=muster-bench-chart -f "$dir/chart-applied.yaml" > "$dir/chart-applied.log" \
  || { cat "$dir/chart-applied.log" >&2; die "applying the chart's objects failed"; }
log "applied from the chart (BENCH_APF=$apf): $(cut -d/ -f1 "$dir/chart-applied.log" | sort | uniq -c | tr -s ' ' | tr '\n' ',')"
# Bench only: muster on this machine keeps its own webhook configurations
# (--webhook-manage-configurations); the chart's RBAC only lets it patch the chart's caBundle.
kc apply --server-side --field-manager=muster-bench -f - > /dev/null <<'YAML' || die "the bench-only ClusterRole failed"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: muster-bench-webhook-configurations}
rules:
  - apiGroups: [admissionregistration.k8s.io]
    resources: [validatingwebhookconfigurations]
    resourceNames: [muster-validating]
    verbs: [get, create, patch]
  - apiGroups: [admissionregistration.k8s.io]
    resources: [mutatingwebhookconfigurations]
    resourceNames: [muster-mutating]
    verbs: [get, create, patch]
  # Where served, the policy that records the scheduling API of new jobs, and its binding.
  - apiGroups: [admissionregistration.k8s.io]
    resources: [mutatingadmissionpolicies, mutatingadmissionpolicybindings]
    resourceNames: [muster-scheduling-api]
    verbs: [get, create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: muster-bench-webhook-configurations}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: muster-bench-webhook-configurations}
subjects: [{kind: ServiceAccount, name: muster, namespace: muster-system}]
YAML
token_kubeconfig muster.kubeconfig muster-system muster
# The ordinary user: a ServiceAccount with ConfigMap rights in its own namespace.
kc apply --server-side --field-manager=muster-bench -f - > /dev/null <<'YAML' || die "the bench user failed"
apiVersion: v1
kind: Namespace
metadata: {name: bench-user}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: bench-user, namespace: bench-user}
---
# What `edit` grants on ConfigMaps (the built-in `edit` is aggregated, and this control plane
# runs no clusterrole-aggregation controller: it is empty here).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: bench-user-configmaps, namespace: bench-user}
rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, list, watch, create, update, patch, delete, deletecollection]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bench-user-configmaps, namespace: bench-user}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: bench-user-configmaps}
subjects: [{kind: ServiceAccount, name: bench-user, namespace: bench-user}]
YAML
token_kubeconfig bench-user.kubeconfig bench-user bench-user
log "muster runs as $("$bin/kubectl" --kubeconfig "$dir/muster.kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}'): $(apf_of "$dir/muster.kubeconfig")"
log "the ordinary user is $("$bin/kubectl" --kubeconfig "$dir/bench-user.kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}'): $(apf_of "$dir/bench-user.kubeconfig")"

# MUSTER_CLUSTER_DIR in its environment marks it as this cluster's for cluster-down.
MUSTER_CLUSTER_DIR=$dir setsid "$muster" run --kubeconfig "$dir/muster.kubeconfig" --namespace muster-system \
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
    # DWARF call graphs: the release build keeps no frame pointers, so `-g` gives no stacks.
    # 49 samples a second of muster's CPU time, 16 KiB of stack each (deep async stacks).
    perf record -F 49 --call-graph dwarf,16384 -p "$muster_pid" -o "$dir/profile/perf.data" > "$dir/profile/perf.log" 2>&1 &
    profiler_pid=$! ;;
  heaptrack)
    mkdir -p "$dir/profile"
    heaptrack -o "$dir/profile/heaptrack" -p "$muster_pid" > "$dir/profile/heaptrack.log" 2>&1 &
    profiler_pid=$! ;;
  apiserver | scheduler)
    component=$BENCH_PROFILE
    mkdir -p "$dir/profile"
    rm -f "$dir/profile/$component"*
    sched_base=$(sed -n 's|^SCHEDULER_HEALTHZ=\(.*\)/healthz$|\1|p' "$dir/cluster.env")
    # One component's endpoint: kube-apiserver's through the admin kubeconfig, kube-scheduler's
    # straight (anonymous, the paths its flags open).
    fetch() {
      if [ "$component" = apiserver ]; then kc get --raw "$1"; else curl -sfk "$sched_base$1"; fi
    }
    # A path's first pod says it started (its namespace is made before the first path): from
    # then on, one profile of the path's steady state (creates and binds under way), taken by
    # the component itself. The check asks for one pod's name, twice a second.
    (
      IFS=, read -ra each <<< "$paths"
      for p in "${each[@]}"; do
        until kc get --raw "/api/v1/namespaces/bench-$p/pods?limit=1" 2> /dev/null | grep -q '"uid"'; do sleep 0.5; done
        sleep "${BENCH_PROFILE_DELAY:-5}"
        [ "$component" = scheduler ] && fetch /metrics > "$dir/profile/scheduler-$p.metrics-0" 2> /dev/null
        fetch "/debug/pprof/profile?seconds=${BENCH_PROFILE_SECONDS:-20}" > "$dir/profile/$component-$p.pprof" \
          2>> "$dir/profile/$component.log" && echo "path $p: $(date +%T)" >> "$dir/profile/$component.log"
        [ "$component" = scheduler ] && fetch /metrics > "$dir/profile/scheduler-$p.metrics-1" 2> /dev/null
      done
    ) &
    profiler_pid=$! ;;
  *) die "BENCH_PROFILE must be perf, heaptrack, apiserver or scheduler" ;;
esac
log "muster ready (pid $muster_pid, metrics http://127.0.0.1:$metrics_port/metrics, log $dir/logs/muster.log)"

mkdir -p "$(dirname "$out")"
rc=0
"$muster" dev bench --kubeconfig "$dir/kubeconfig" --nodes "$nodes" --gangs "$gangs" --size "$size" \
  --paths "$paths" --muster-pid "$muster_pid" --muster-metrics-url "http://127.0.0.1:$metrics_port/metrics" \
  --concurrency "$concurrency" --rate "$rate" --timeout "$timeout" --settle-timeout "$settle" "${clean[@]}" --json-out "$out" \
  --user-kubeconfig "$dir/bench-user.kubeconfig" --user-namespace bench-user \
  --user-interval-ms "${BENCH_USER_INTERVAL_MS:-1000}" || rc=$?
log "muster ran as the chart's ServiceAccount (BENCH_APF=$apf): $(apf_of "$dir/muster.kubeconfig")"
# Requests the API server dispatched per FlowSchema and priority level over the whole run (not
# the exempt ones: admin, the bench's own client): where APF put muster and the user.
log "dispatched requests by FlowSchema / priority level (whole run, exempt left out):"
kc get --raw /metrics 2> /dev/null | grep '^apiserver_flowcontrol_dispatched_requests_total' | grep -v 'priority_level="exempt"' \
  | sed -E 's/.*flow_schema="([^"]*)".*priority_level="([^"]*)".*\} (.*)/  \1 \/ \2: \3/' | sort -t: -k2 -rn >&2 || true
rejected=$(kc get --raw /metrics 2> /dev/null | grep '^apiserver_flowcontrol_rejected_requests_total' || true)
[ -z "$rejected" ] || { log "requests APF rejected (429):"; echo "$rejected" >&2; }
# The admission webhooks and policies as the API server timed them over the whole run: what
# each adds to a request that passes through it (calls, mean ms, by operation).
log "admission webhooks and policies as the API server timed them (whole run):"
kc get --raw /metrics 2> /dev/null | awk '
  /^apiserver_(admission_webhook_admission|validating_admission_policy_check|mutating_admission_policy_check)_duration_seconds_(sum|count)\{/ {
    who = ""
    if (match($0, /[{,]name="[^"]*"/)) who = substr($0, RSTART + 7, RLENGTH - 8)
    else if (match($0, /[{,]policy="[^"]*"/)) who = substr($0, RSTART + 9, RLENGTH - 10)
    op = ""
    if (match($0, /operation="[^"]*"/)) op = " " substr($0, RSTART + 11, RLENGTH - 12)
    key = who op
    if ($0 ~ /_sum\{/) sum[key] += $NF; else count[key] += $NF
  }
  END { for (k in count) if (count[k] > 0) printf "  %s: %d calls, %.2f ms mean\n", k, count[k], 1000 * sum[k] / count[k] }' \
  | sort >&2 || true
# Events per path's namespace, by reporting component and reason: who writes the events.
log "events by namespace / component / reason (count):"
# An event names its component in reportingComponent (events.k8s.io) or source.component (core
# v1), some in both: the first one set.
kc get events -A -o jsonpath='{range .items[*]}{.metadata.namespace}|{.reportingComponent}|{.source.component}|{.reason}{"\n"}{end}' 2> /dev/null \
  | awk -F'|' '$1 ~ /^bench-/ { print $1, ($2 != "" ? $2 : $3), $4 }' | sort | uniq -c | sort -k2,2 -k1,1rn | sed 's/^/  /' >&2 || true
forbidden=$(grep -ci forbidden "$dir/logs/muster.log" || true)
log "muster's log: $forbidden line(s) saying forbidden"
kill -0 "$muster_pid" 2> /dev/null || { log "muster died during the bench:"; tail -n 20 "$dir/logs/muster.log" >&2; rc=1; }
if [ "${BENCH_HOSTILE:-}" = 1 ]; then
  log "hostile job: $(kc -n bench-hostile get musterjob absurd -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' 2>&1)"
  log "hostile job's pods: $(kc -n bench-hostile get pods --no-headers 2> /dev/null | wc -l)"
  log "muster's peak RSS: $(grep VmHWM "/proc/$muster_pid/status" 2> /dev/null || echo 'muster is gone')"
fi
[ $rc = 0 ] || log "the bench failed (exit $rc); logs in $dir/logs"
exit $rc
