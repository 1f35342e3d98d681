#!/usr/bin/env bash
# Starts a local Kubernetes control plane on free 127.0.0.1 ports (kube-apiserver's address can
# be another): etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok (fake nodes
# annotated kwok.x-k8s.io/node=fake). DRA is on (resource.k8s.io/v1, kube-scheduler's
# DynamicResources, kube-controller-manager's resourceclaim-controller); no DRA driver runs:
# `muster dev dra-slices` publishes fake NVIDIA ResourceSlices for kwok GPU nodes.
#
#   MUSTER_APISERVER_ADDRESS  IPv4 address kube-apiserver listens on and the kubeconfig names
#                         (default 127.0.0.1; another one must already be on an interface of this
#                         machine, e.g. the veth of hack/testhost.sh); its serving cert covers it
#   MUSTER_APISERVER_EXTRA_ARGS  more kube-apiserver flags, whitespace separated (e.g.
#                         --enable-aggregator-routing=true)
#   MUSTER_SCHEDULER_EXTRA_ARGS  more kube-scheduler flags, the same way
#   MUSTER_CLUSTER_DIR  where everything lives (default target/cluster): kubeconfig, logs/, pids/, pki/
#   MUSTER_K8S_BIN      folder with the binaries (default: tools/k8s/bindir.sh; build with `make controlplane`)
#   MUSTER_FEATURE_GATES  gates to ask for (default below; empty asks for none; `Name=false` turns one
#                         off); the ones the binaries refuse are dropped and reported
#   MUSTER_RUNTIME_CONFIG extra API versions to serve (default below; empty serves only the defaults;
#                         `resource.k8s.io/v1=false` turns one off)
#   MUSTER_EXTRA_CONTROLLERS  more kube-controller-manager controllers, comma separated (the real
#                         node's lane adds endpoints-controller,endpointslice-controller: Services
#                         with pods behind them)
#   MUSTER_KWOK_HEARTBEAT  MIN,MAX seconds: each kwok node refreshes its conditions (Node status)
#                       after a delay drawn from [MIN, MAX] (default 300,360, as hack/kwok/stages.yaml
#                       says); `0,600` spreads the refreshes of nodes made at once evenly in time
#   MUSTER_CLUSTER_CRDS   CRD manifests (file or folder) installed before kube-controller-manager
#                         starts, so its garbage collector knows them at once (default crds/; "" = none)
#
# A healthy cluster already running in the folder is reused; anything else there is stopped and
# replaced. Prints the kubeconfig path last. Stop with hack/cluster-down.sh (same MUSTER_CLUSTER_DIR).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${MUSTER_CLUSTER_DIR:-$root/target/cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin=${MUSTER_K8S_BIN:-$(bash "$root/tools/k8s/bindir.sh")}
gates_wanted=${MUSTER_FEATURE_GATES-GenericWorkload,CompositePodGroup,WorkloadWithJob,TopologyAwareWorkloadScheduling,DRAWorkloadResourceClaims}
runtime_wanted=${MUSTER_RUNTIME_CONFIG-scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true}
components=(etcd kube-apiserver kube-scheduler kube-controller-manager kwok)
api_address=${MUSTER_APISERVER_ADDRESS:-127.0.0.1}
read -r -a api_extra_args <<< "${MUSTER_APISERVER_EXTRA_ARGS:-}"
read -r -a sched_extra_args <<< "${MUSTER_SCHEDULER_EXTRA_ARGS:-}"
crds=${MUSTER_CLUSTER_CRDS-$root/crds}

log() { echo "cluster-up: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for b in "${components[@]}" kubectl; do
  [ -x "$bin/$b" ] || die "$bin/$b missing: run 'make controlplane' (tools/k8s/build.sh)"
done
for t in openssl curl python3 setsid flock; do
  command -v "$t" > /dev/null || die "$t not found"
done
[[ $api_address =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "MUSTER_APISERVER_ADDRESS=$api_address is not an IPv4 address"

exec 9> "$dir/.lock"
flock 9

kubeconfig=$dir/kubeconfig
pki=$dir/pki
logs=$dir/logs
pids=$dir/pids
kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# A process we started is alive when its pid file names a live process whose command line
# mentions this folder (guards against a recycled pid).
alive() {
  local f=$pids/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(< "$f")
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$dir/"
}

healthy() {
  local c a cmd
  for c in "${components[@]}"; do alive "$c" || return 1; done
  cmd=" $(tr '\0' ' ' < "/proc/$(< "$pids/kube-apiserver.pid")/cmdline") "
  for a in "${api_extra_args[@]}"; do [[ $cmd == *" $a "* ]] || return 1; done
  [ -f "$kubeconfig" ] && grep -qF "server: https://$api_address:" "$kubeconfig" \
    && kc get --raw /readyz > /dev/null 2>&1
}

if healthy; then
  log "reusing the healthy cluster in $dir"
  cat "$dir/features.txt" >&2 2>/dev/null || true
  echo "$kubeconfig"
  exit 0
fi
if ls "$pids"/*.pid > /dev/null 2>&1; then
  log "a cluster in $dir is not healthy: stopping it and starting afresh"
  MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" >&2
fi
rm -rf "$dir/etcd" "$pids" "$logs" "$dir/features.txt"
mkdir -p "$pki" "$logs" "$pids"

# --- PKI: one CA; a serving cert with 127.0.0.1 (and MUSTER_APISERVER_ADDRESS) as IP SANs; one
# admin client cert (system:masters).
if [ ! -f "$pki/admin.key" ]; then
  (
    cd "$pki"
    rm -f serving.crt
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=muster-e2e-ca \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout ca.key -out ca.crt
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > client.ext
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=muster-admin" -keyout admin.key -out admin.csr
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out admin.crt
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
    rm -f ./*.csr
  ) > "$logs/pki.log" 2>&1 || die "openssl failed: see $logs/pki.log"
fi
# (Re)issued when it does not cover the address (a folder reused with another one).
if ! { [ -f "$pki/serving.crt" ] && openssl x509 -in "$pki/serving.crt" -noout -ext subjectAltName 2> /dev/null \
  | grep -qE "IP Address:${api_address//./\\.}(,|\$)"; }; then
  sans="IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  [ "$api_address" = 127.0.0.1 ] || sans+=",IP:$api_address"
  (
    cd "$pki"
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$sans" > serving.ext
    openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout serving.key -out serving.csr
    openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile serving.ext -out serving.crt
    rm -f serving.csr
  ) >> "$logs/pki.log" 2>&1 || die "openssl failed: see $logs/pki.log"
fi

# --- Feature gates: keep the ones every component lists in its --help; report the rest.
accepted_gates=()
refused=()
IFS=, read -r -a wanted <<< "$gates_wanted"
for c in kube-apiserver kube-scheduler kube-controller-manager; do
  "$bin/$c" --help > "$logs/$c.help" 2>&1 || true
done
for g in "${wanted[@]}"; do
  # A gate is asked for on (`Name`) or set as written (`Name=false`).
  [[ $g == *=* ]] || g=$g=true
  ok=1
  for c in kube-apiserver kube-scheduler kube-controller-manager; do
    grep -qE "(^|[ :])${g%%=*}=true\|false" "$logs/$c.help" || { ok=0; refused+=("${g%%=*} (not known to $c)"); }
  done
  [ $ok = 1 ] && accepted_gates+=("$g")
done

free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

start() {
  local name=$1; shift
  setsid "$@" > "$logs/$name.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$pids/$name.pid"
}

# Polls a command until it succeeds; fails when the component died or the time is up.
wait_until() {
  local what=$1 component=$2 secs=$3; shift 3
  local deadline=$((SECONDS + secs))
  until "$@" > /dev/null 2>&1; do
    alive "$component" || { log "$component exited; last lines of $logs/$component.log:"; tail -n 20 "$logs/$component.log" >&2; return 1; }
    [ $SECONDS -lt $deadline ] || { log "timed out waiting for $what"; tail -n 20 "$logs/$component.log" >&2; return 1; }
    sleep 0.2
  done
}

stop_all() { MUSTER_CLUSTER_DIR=$dir bash "$root/hack/cluster-down.sh" > /dev/null 2>&1 || true; }

write_kubeconfig() {
  local server=$1 out=$2
  rm -f "$out"
  KUBECONFIG=$out "$bin/kubectl" config set-cluster muster --server="$server" \
    --certificate-authority="$pki/ca.crt" --embed-certs=true > /dev/null
  KUBECONFIG=$out "$bin/kubectl" config set-credentials muster-admin \
    --client-certificate="$pki/admin.crt" --client-key="$pki/admin.key" --embed-certs=true > /dev/null
  KUBECONFIG=$out "$bin/kubectl" config set-context muster --cluster=muster --user=muster-admin > /dev/null
  KUBECONFIG=$out "$bin/kubectl" config use-context muster > /dev/null
}

began=$SECONDS
attempt=0
runtime_config=$runtime_wanted
while :; do
  attempt=$((attempt + 1))
  read -r etcd_port peer_port api_port sched_port cm_port kwok_port <<< "$(free_ports 6)"
  gates=$(IFS=,; for g in "${accepted_gates[@]}"; do printf '%s,' "$g"; done)
  gates=${gates%,}
  rm -rf "$dir/etcd"

  start etcd "$bin/etcd" --name=muster --data-dir="$dir/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="muster=http://127.0.0.1:$peer_port" --unsafe-no-fsync=true \
    --quota-backend-bytes=8589934592 --auto-compaction-retention=1 --log-level=warn
  wait_until "etcd" etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health" || { stop_all; die "etcd did not start"; }

  # TaintNodesByCondition is off: no node-lifecycle controller runs to lift the not-ready
  # taint it puts on every new Node, so kwok nodes would never take pods.
  start kube-apiserver "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --etcd-prefix=/registry \
    --bind-address="$api_address" --advertise-address="$api_address" --secure-port="$api_port" \
    --tls-cert-file="$pki/serving.crt" --tls-private-key-file="$pki/serving.key" --cert-dir="$dir/serving" \
    --client-ca-file="$pki/ca.crt" --authorization-mode=RBAC --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --endpoint-reconciler-type=none \
    --enable-priority-and-fairness=false --max-requests-inflight=0 --max-mutating-requests-inflight=0 \
    --disable-admission-plugins=TaintNodesByCondition \
    --profiling=false --feature-gates="$gates" --runtime-config="$runtime_config" "${api_extra_args[@]}"
  write_kubeconfig "https://$api_address:$api_port" "$kubeconfig"
  if ! wait_until "kube-apiserver /readyz" kube-apiserver 90 kc get --raw /readyz; then
    # An unknown group/version in --runtime-config is fatal at start: drop it and say so.
    # (1.37.2 says: err="group version scheduling.k8s.io/v1alpha9 that has not been registered")
    bad=$(grep -oE 'group version [^ ]+ that has not been registered' "$logs/kube-apiserver.log" | head -n 1 | cut -d' ' -f3 || true)
    if grep -q "address already in use" "$logs"/*.log && [ $attempt -lt 4 ]; then
      log "a port was taken meanwhile; retrying with new ports"; stop_all; mkdir -p "$pids"; continue
    fi
    if [ -n "$bad" ] && [[ ",$runtime_config," == *",$bad=true,"* ]] && [ $attempt -lt 4 ]; then
      log "kube-apiserver refused --runtime-config $bad=true; dropping it"
      refused+=("runtime-config $bad=true (refused by kube-apiserver: $(grep -m1 -F "$bad" "$logs/kube-apiserver.log" | cut -c1-200))")
      runtime_config=$(tr , '\n' <<< "$runtime_config" | grep -vF "$bad=" | paste -sd, -)
      stop_all; mkdir -p "$pids"; continue
    fi
    stop_all; die "kube-apiserver did not become ready (see $logs/kube-apiserver.log)"
  fi
  break
done

wait_until "namespaces default and kube-system" kube-apiserver 60 kc get namespace default kube-system \
  || { stop_all; die "system namespaces missing"; }
for gv in ${runtime_config//,/ }; do
  # `<group/version>=false` turns a version off (e.g. resource.k8s.io/v1=false: no DRA).
  [[ $gv == *=true ]] || continue
  gv=${gv%=true}
  # An older kube-apiserver may accept a version and serve nothing in it (1.34 has no
  # scheduling.k8s.io/v1beta1 kinds): reported, not fatal.
  if ! wait_until "discovery of $gv" kube-apiserver 10 kc get --raw "/apis/$gv"; then
    log "$gv is not served although --runtime-config asked for it"
    refused+=("runtime-config $gv=true (accepted, but nothing served in it by $("$bin/kube-apiserver" --version))")
  fi
done
# DRA (GA, on by default from 1.34): muster allocates ResourceClaims itself on DRA nodes. An
# older control plane serves no resource.k8s.io/v1: muster then leaves the DRA path out.
if ! wait_until "discovery of resource.k8s.io/v1" kube-apiserver 30 kc get --raw /apis/resource.k8s.io/v1; then
  log "resource.k8s.io/v1 (DRA) is not served by this kube-apiserver: no DRA path"
  refused+=("resource.k8s.io/v1 (not served by $("$bin/kube-apiserver" --version))")
fi

# The garbage collector rediscovers resource types only every 30 s; CRDs known at its start
# spare tests that wait.
if [ -n "$crds" ]; then
  kc apply --server-side --field-manager=muster-cluster-up -f "$crds" > /dev/null || { stop_all; die "cannot install $crds"; }
  kc wait --for=condition=Established --timeout=60s -f "$crds" > /dev/null || { stop_all; die "CRDs in $crds not established"; }
fi

cat > "$dir/scheduler.yaml" << EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: $kubeconfig, qps: 200, burst: 400}
leaderElection: {leaderElect: false}
profiles: [{schedulerName: default-scheduler}]
EOF
# The plugins kube-scheduler really runs (its default profile depends on the gates): the
# effective configuration is written once (the binary exits after writing it), before the real
# start. DRA needs DynamicResources among them (default with the GA DynamicResourceAllocation).
sched_plugins=""
if "$bin/kube-scheduler" --config="$dir/scheduler.yaml" --feature-gates="$gates" --secure-port=0 \
  --write-config-to="$dir/scheduler-effective.yaml" > "$logs/kube-scheduler-config.log" 2>&1; then
  sched_plugins=$(awk '/^    multiPoint:/ {m = 1; next} m && /^    [^ ]/ {m = 0}
    m && /^      disabled:/ {d = 1} m && /^      enabled:/ {d = 0} m && !d && /- name:/ {print $3}' \
    "$dir/scheduler-effective.yaml" | paste -sd' ' -)
fi
[[ " $sched_plugins " == *" DynamicResources "* ]] \
  || log "WARNING: kube-scheduler's profile lacks DynamicResources (plugins: ${sched_plugins:-unknown, see $logs/kube-scheduler-config.log})"
# Health endpoints only (always allowed); no delegated authn/authz, so no request-header CA noise.
serving=(--bind-address=127.0.0.1 --tls-cert-file="$pki/serving.crt" --tls-private-key-file="$pki/serving.key")
start kube-scheduler "$bin/kube-scheduler" --config="$dir/scheduler.yaml" --secure-port="$sched_port" \
  "${serving[@]}" --feature-gates="$gates" "${sched_extra_args[@]}"
controllers=garbage-collector-controller,namespace-controller,job-controller,ttl-after-finished-controller,statefulset-controller,replicaset-controller,deployment-controller
controllers+=,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller
controllers+=,pod-garbage-collector-controller
# The chart's node agent is a DaemonSet (charts/muster, nodeAgent.enabled): its pods on kwok
# nodes. Its ValidatingAdmissionPolicy gets status.typeChecking (CEL type warnings) from the
# status controller.
controllers+=,daemonset-controller,validatingadmissionpolicy-status-controller
# DRA: creates the ResourceClaims of pods' ResourceClaimTemplates (gated pods too), takes pods
# that are gone or done out of a claim's reservedFor, deallocates a claim whose last consumer
# went (claims with the resource.kubernetes.io/delete-protection finalizer) and deletes claims
# generated for a pod that will not run. 1.37's name; `resource-claim-controller` is an alias.
controllers+=,resourceclaim-controller
# Gang preemption evicts through the Eviction API: PodDisruptionBudgets get their
# disruptionsAllowed from the disruption controller (without it every budget refuses).
controllers+=,disruption-controller
controllers+=,podgroup-protection-controller
[ -z "${MUSTER_EXTRA_CONTROLLERS:-}" ] || controllers+=,$MUSTER_EXTRA_CONTROLLERS
# Older control planes lack some of these (podgroup-protection-controller is 1.37's; before
# 1.34 the DRA claim controller is `resource-claim-controller`, behind its gate): only those the
# binary lists are asked for, the others reported.
kept=()
for c in ${controllers//,/ }; do
  if grep -qE "(^|[ ,])$c([ ,]|$)" "$logs/kube-controller-manager.help"; then
    kept+=("$c")
  elif [ "$c" = resourceclaim-controller ] && grep -qE "(^|[ ,])resource-claim-controller([ ,]|$)" "$logs/kube-controller-manager.help"; then
    kept+=(resource-claim-controller)
  else
    refused+=("controller $c (not known to kube-controller-manager)")
  fi
done
controllers=$(IFS=,; echo "${kept[*]}")
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$kubeconfig" \
  --controllers="$controllers" --leader-elect=false --secure-port="$cm_port" "${serving[@]}" \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --kube-api-qps=200 --kube-api-burst=400 --feature-gates="$gates"
stages=$root/hack/kwok/stages.yaml
if [ -n "${MUSTER_KWOK_HEARTBEAT:-}" ]; then
  IFS=, read -r hb_min hb_max <<< "$MUSTER_KWOK_HEARTBEAT"
  [[ "$hb_min" =~ ^[0-9]+$ && "$hb_max" =~ ^[0-9]+$ && "$hb_min" -le "$hb_max" ]] \
    || die "MUSTER_KWOK_HEARTBEAT must be MIN,MAX seconds (MIN <= MAX), not '$MUSTER_KWOK_HEARTBEAT'"
  # The heartbeat stage's delay: the only `durationMilliseconds: 300000` and jitter lines.
  heartbeat='^    (jitterD|d)urationMilliseconds: (300000|360000)$'
  [ "$(grep -cE "$heartbeat" "$stages")" = 2 ] || die "MUSTER_KWOK_HEARTBEAT: no heartbeat delay found in $stages"
  sed -e "s/^    durationMilliseconds: 300000$/    durationMilliseconds: $((hb_min * 1000))/" \
    -e "s/^    jitterDurationMilliseconds: 360000$/    jitterDurationMilliseconds: $((hb_max * 1000))/" \
    "$stages" > "$dir/kwok-stages.yaml"
  stages=$dir/kwok-stages.yaml
fi
start kwok "$bin/kwok" --kubeconfig="$kubeconfig" --config="$stages" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --cidr=10.0.0.0/16 --node-ip=10.0.0.1 --node-lease-duration-seconds=40 \
  --server-address="127.0.0.1:$kwok_port"

ca=(--cacert "$pki/ca.crt")
wait_until "kube-scheduler /healthz" kube-scheduler 60 curl -sf "${ca[@]}" "https://127.0.0.1:$sched_port/healthz" \
  || { stop_all; die "kube-scheduler did not start"; }
wait_until "kube-controller-manager /healthz" kube-controller-manager 60 curl -sf "${ca[@]}" "https://127.0.0.1:$cm_port/healthz" \
  || { stop_all; die "kube-controller-manager did not start"; }
wait_until "kwok /healthz" kwok 60 curl -sf "http://127.0.0.1:$kwok_port/healthz" \
  || { stop_all; die "kwok did not start"; }
wait_until "the default ServiceAccount" kube-controller-manager 60 kc -n default get serviceaccount default \
  || { stop_all; die "serviceaccount-controller made no default ServiceAccount"; }

# --- What the apiserver really serves.
{
  echo "# muster cluster in $dir ($("$bin/kube-apiserver" --version))"
  echo "feature-gates (kube-apiserver, kube-scheduler, kube-controller-manager): ${gates:-none}"
  echo "runtime-config: $runtime_config"
  if [ ${#refused[@]} -gt 0 ]; then
    for r in "${refused[@]}"; do echo "dropped: $r"; done
  else
    echo "dropped: none"
  fi
  echo "controllers: $controllers"
  echo "api-versions (scheduling.k8s.io): $(kc api-versions | grep '^scheduling\.k8s\.io/' | paste -sd' ' -)"
  for gv in $(kc api-versions | grep '^scheduling\.k8s\.io/'); do
    echo "served $gv: $(kc get --raw "/apis/$gv" | python3 -c 'import json, sys; print(" ".join(r["name"] for r in json.load(sys.stdin)["resources"]))')"
  done
  echo "api-resources --api-group=scheduling.k8s.io (preferred versions):"
  kc api-resources --api-group=scheduling.k8s.io -o wide | sed 's/^/  /'
  echo "api-versions (resource.k8s.io): $(kc api-versions | grep '^resource\.k8s\.io/' | paste -sd' ' -)"
  for gv in $(kc api-versions | grep '^resource\.k8s\.io/'); do
    echo "served $gv: $(kc get --raw "/apis/$gv" | python3 -c 'import json, sys; print(" ".join(r["name"] for r in json.load(sys.stdin)["resources"]))')"
  done
  echo "kube-scheduler plugins (multiPoint, profile default-scheduler): ${sched_plugins:-unknown}"
} > "$dir/features.txt"

cat > "$dir/cluster.env" << EOF
KUBECONFIG=$kubeconfig
MUSTER_K8S_BIN=$bin
APISERVER=https://$api_address:$api_port
ETCD=http://127.0.0.1:$etcd_port
SCHEDULER_HEALTHZ=https://127.0.0.1:$sched_port/healthz
CONTROLLER_MANAGER_HEALTHZ=https://127.0.0.1:$cm_port/healthz
KWOK_HEALTHZ=http://127.0.0.1:$kwok_port/healthz
EOF

cat "$dir/features.txt" >&2
log "ready in $((SECONDS - began))s: export KUBECONFIG=$kubeconfig (logs in $logs)"
echo "$kubeconfig"
