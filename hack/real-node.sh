#!/usr/bin/env bash
# A real node beside the kwok nodes: containerd (tools/k8s/build-node.sh) with Debian's runc,
# kubelet and kube-proxy at the control plane's version, and a CNI bridge, on this machine.
#
#   hack/real-node.sh address   puts the node's address (MUSTER_NODE_ADDRESS, default
#                               10.253.0.1) on the loopback interface (this kernel has no dummy
#                               links), so kube-apiserver can listen
#                               there (cluster-up.sh's MUSTER_APISERVER_ADDRESS) and pods reach
#                               it through the bridge; prints the address
#   hack/real-node.sh up        starts containerd, kubelet and kube-proxy against the cluster in
#                               MUSTER_CLUSTER_DIR (started with that address, see
#                               `make e2e-real`), imports the images in MUSTER_NODE_IMAGES (OCI
#                               archives, the pause image first) and waits for the Node to be Ready
#   hack/real-node.sh down      stops them, removes every container, mount, cgroup, iptables
#                               rule and interface they made (also after a crash)
#
#   MUSTER_NODE_NAME   the Node's name (default muster-real-0)
#   MUSTER_NODE_DIR    containerd's root and state, configs, logs (default $MUSTER_CLUSTER_DIR/node)
#
# Needs root (kubelet, containerd and runc do), iptables, runc. kubelet's root is the usual
# /var/lib/kubelet, so the chart's hostPaths (PodResources socket, device plugins) are the
# ones of a production node; one real node runs on a machine at a time (a lock says so).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-}
address=${MUSTER_NODE_ADDRESS:-10.253.0.1}
node_name=${MUSTER_NODE_NAME:-muster-real-0}
cluster=${MUSTER_CLUSTER_DIR:-$root/target/cluster}
node=${MUSTER_NODE_DIR:-$cluster/node}
kbin=${MUSTER_K8S_BIN:-$(bash "$root/tools/k8s/bindir.sh")}
rbin=$(bash "$root/tools/k8s/bindir.sh" node)
kubelet_root=/var/lib/kubelet
iface=lo
bridge=muster-cni0
pod_cidr=10.254.0.0/24
log() { echo "real-node: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "kubelet, containerd and runc need root"

add_address() {
  ip addr show dev "$iface" | grep -qF " $address/32" || ip addr add "$address/32" dev "$iface"
  # Pods reach the apiserver and each other through the host: forwarding on, and bridged
  # traffic through iptables (kube-proxy's Service rules for pod-to-pod Service traffic).
  sysctl -qw net.ipv4.ip_forward=1
  modprobe br_netfilter 2> /dev/null || true
  [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || sysctl -qw net.bridge.bridge-nf-call-iptables=1
}

# Stops a process we started (pid file), TERM then KILL.
stop_pid() {
  local f=$node/pids/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(< "$f")
  if kill -0 "$pid" 2> /dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$node/"; then
    kill "$pid" 2> /dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2> /dev/null || true
  fi
  rm -f "$f"
}

down() {
  stop_pid kube-proxy
  stop_pid kubelet
  # Every container and sandbox containerd ran, then containerd itself.
  local sock=$node/containerd.sock
  if [ -S "$sock" ] && "$rbin/ctr" --address "$sock" version > /dev/null 2>&1; then
    for ns in $("$rbin/ctr" --address "$sock" namespaces ls -q); do
      for t in $("$rbin/ctr" --address "$sock" -n "$ns" tasks ls -q 2> /dev/null); do
        "$rbin/ctr" --address "$sock" -n "$ns" tasks kill -s SIGKILL "$t" > /dev/null 2>&1 || true
      done
      sleep 0.5
      for t in $("$rbin/ctr" --address "$sock" -n "$ns" tasks ls -q 2> /dev/null); do
        "$rbin/ctr" --address "$sock" -n "$ns" tasks delete -f "$t" > /dev/null 2>&1 || true
      done
    done
  fi
  stop_pid containerd
  # Shims left behind by a containerd that died, and their containers.
  pkill -9 -f "containerd-shim-runc-v2 .*-address $node/" 2> /dev/null || true
  if [ -d "$node/runc" ]; then
    for c in $(runc --root "$node/runc/k8s.io" list -q 2> /dev/null); do
      runc --root "$node/runc/k8s.io" kill "$c" KILL 2> /dev/null || true
      runc --root "$node/runc/k8s.io" delete -f "$c" 2> /dev/null || true
    done
  fi
  # Mounts under kubelet's and containerd's folders (secret tmpfs, overlays, shm, netns).
  for _ in 1 2 3; do
    { awk '{print $2}' /proc/mounts | grep -E "^($kubelet_root|$node|/run/netns/cni-)" || true; } | sort -r \
      | while read -r m; do umount "$m" 2> /dev/null || umount -l "$m" 2> /dev/null || true; done
  done
  rm -f /run/netns/cni-* 2> /dev/null || true
  # The pod cgroups kubelet made (cgroupfs driver: /kubepods in each hierarchy).
  for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
    [ -d "$h/kubepods" ] || continue
    find "$h/kubepods" -depth -type d -exec rmdir {} + 2> /dev/null || true
  done
  # kube-proxy's rules (its --cleanup), then kubelet's own chains (KUBE-FIREWALL drops
  # non-loopback traffic to 127.0.0.0/8), the bridge and its leases.
  [ ! -x "$kbin/kube-proxy" ] || "$kbin/kube-proxy" --cleanup > /dev/null 2>&1 || true
  for ipt in iptables ip6tables; do
    command -v "$ipt" > /dev/null || continue
    for table in filter nat mangle; do
      for hook in INPUT OUTPUT; do
        while "$ipt" -w -t "$table" -D "$hook" -j KUBE-FIREWALL 2> /dev/null; do :; done
      done
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-PROXY-CANARY KUBE-IPTABLES-HINT; do
        "$ipt" -w -t "$table" -F "$chain" 2> /dev/null && "$ipt" -w -t "$table" -X "$chain" 2> /dev/null || true
      done
    done
  done
  ip link del "$bridge" 2> /dev/null || true
  rm -rf /var/lib/cni/networks/muster "$kubelet_root"
  if [ "${MUSTER_NODE_KEEP_ADDRESS:-}" != 1 ]; then
    ip addr del "$address/32" dev "$iface" 2> /dev/null || true
  fi
  if [ -f "$node/root-propagation" ]; then
    [ "$(< "$node/root-propagation")" != private ] || mount --make-rprivate /
    rm -f "$node/root-propagation"
  fi
  rm -f "$node/.running"
}

case "$what" in
  address) add_address; echo "$address"; exit 0 ;;
  down) down; log "stopped"; exit 0 ;;
  up) ;;
  *) die "usage: hack/real-node.sh address|up|down" ;;
esac

for b in kubelet kube-proxy kubectl; do
  [ -x "$kbin/$b" ] || die "$kbin/$b missing: run 'bash tools/k8s/build-node.sh'"
done
for b in containerd containerd-shim-runc-v2 ctr cni/bridge cni/host-local cni/loopback cni/portmap; do
  [ -x "$rbin/$b" ] || die "$rbin/$b missing: run 'bash tools/k8s/build-node.sh'"
done
for t in runc iptables ip; do
  command -v "$t" > /dev/null || die "$t not found (hack/host-deps.sh real installs it)"
done
kubeconfig=$cluster/kubeconfig
[ -f "$kubeconfig" ] || die "no cluster in $cluster (hack/cluster-up.sh)"
grep -qF "server: https://$address:" "$kubeconfig" \
  || die "the cluster in $cluster does not listen on $address: start it with MUSTER_APISERVER_ADDRESS=$address (make e2e-real does)"
kc() { "$kbin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

mkdir -p /run/muster
exec 8> /run/muster/real-node.lock
flock -n 8 || die "another real node runs on this machine (lock /run/muster/real-node.lock)"

# Whatever a previous run left (a crash, a kill) goes first.
down
add_address
# A mount with propagation HostToContainer (the chart's node agent mounts the driver root `/`
# so) needs its host mount shared or slave; systemd makes `/` shared at boot, this machine has
# it private ("path "/" is mounted on "/" but it is not a shared or slave mount").
# `down` puts it back.
mkdir -p "$node"/{logs,pids,cni/net.d} "$kubelet_root"
if [ "$(findmnt -no PROPAGATION /)" != shared ]; then
  findmnt -no PROPAGATION / > "$node/root-propagation"
  mount --make-rshared /
fi
export PATH=$rbin:$PATH

read -r kubelet_port kubelet_healthz proxy_healthz proxy_metrics <<< "$(bash "$root/hack/free-ports.sh" 4)"

start() {
  local name=$1; shift
  setsid "$@" > "$node/logs/$name.log" 2>&1 < /dev/null 8>&- &
  echo $! > "$node/pids/$name.pid"
}
wait_until() {
  local what=$1 name=$2 secs=$3; shift 3
  local deadline=$((SECONDS + secs)) pid
  pid=$(< "$node/pids/$name.pid")
  until "$@" > /dev/null 2>&1; do
    kill -0 "$pid" 2> /dev/null || { log "$name exited; last lines of $node/logs/$name.log:"; tail -n 30 "$node/logs/$name.log" >&2; return 1; }
    [ $SECONDS -lt $deadline ] || { log "timed out waiting for $what; last lines of $node/logs/$name.log:"; tail -n 30 "$node/logs/$name.log" >&2; return 1; }
    sleep 0.5
  done
}

# --- CNI: one bridge, addresses from host-local, the host as gateway; portmap for hostPorts.
cat > "$node/cni/net.d/10-muster.conflist" << EOF
{
  "cniVersion": "1.0.0",
  "name": "muster",
  "plugins": [
    {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

# --- containerd: CRI with runc (cgroupfs: no systemd here), the locally built pause image as
# the sandbox image (pinned, so image GC keeps it), no registry: images come from imports.
cat > "$node/containerd.toml" << EOF
version = 3
root = "$node/containerd/root"
state = "$node/containerd/state"
[grpc]
  address = "$node/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/pause:muster"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # No CAP_SYS_RESOURCE on these machines (CapEff lacks bit 24): lowering a process's
  # oom_score_adj is refused, and runc fails every sandbox kubelet asks for at -998 ("can't get
  # final child's PID from pipe: EOF"). As rootless containerd does: never below containerd's own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$node/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$rbin/cni"]
    conf_dir = "$node/cni/net.d"
EOF
start containerd "$rbin/containerd" --config "$node/containerd.toml"
ctr_() { "$rbin/ctr" --address "$node/containerd.sock" "$@"; }
wait_until "containerd" containerd 30 ctr_ version || die "containerd did not start"

# --- Images: imported into the namespace the CRI uses; the pause image is the sandbox.
for img in ${MUSTER_NODE_IMAGES:-}; do
  [ -f "$img" ] || die "image archive $img not found (hack/image.sh builds them)"
  ctr_ -n k8s.io images import "$img" > "$node/logs/import.log" 2>&1 || { cat "$node/logs/import.log" >&2; die "cannot import $img"; }
done
ctr_ -n k8s.io images ls -q | grep -qxF localhost/pause:muster \
  || die "localhost/pause:muster is not in containerd: pass its archive in MUSTER_NODE_IMAGES (hack/image.sh pause)"

# --- kubelet: cgroup v1 allowed (this host is cgroup v1 hybrid), anonymous access to its API
# from the apiserver (no kubelet client certificate in this control plane), no cluster DNS,
# evictions that do not fire on a shared disk, its own oom_score_adj left at 0 (no
# CAP_SYS_RESOURCE to lower it).
cat > "$node/kubelet.yaml" << EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $address
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
containerRuntimeEndpoint: unix://$node/containerd.sock
imageServiceEndpoint: unix://$node/containerd.sock
serializeImagePulls: false
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 110
registerNode: true
EOF
start kubelet "$kbin/kubelet" --config="$node/kubelet.yaml" --kubeconfig="$kubeconfig" \
  --root-dir="$kubelet_root" --hostname-override="$node_name" --node-ip="$address" \
  --node-labels="muster.dev/real-node=true" --v=2
wait_until "kubelet /healthz" kubelet 60 curl -sf "http://127.0.0.1:$kubelet_healthz/healthz" || die "kubelet did not start"

# --- kube-proxy: Services (the apiserver's ClusterIP for in-cluster clients) as iptables rules.
cat > "$node/kube-proxy.yaml" << EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $kubeconfig}
hostnameOverride: $node_name
clusterCIDR: $pod_cidr
healthzBindAddress: 127.0.0.1:$proxy_healthz
metricsBindAddress: 127.0.0.1:$proxy_metrics
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
oomScoreAdj: 0
EOF
start kube-proxy "$kbin/kube-proxy" --config="$node/kube-proxy.yaml" --v=2
wait_until "kube-proxy /healthz" kube-proxy 60 curl -sf "http://127.0.0.1:$proxy_healthz/healthz" || die "kube-proxy did not start"

wait_until "Node $node_name Ready" kubelet 120 \
  bash -c "[ \"\$('$kbin/kubectl' --kubeconfig '$kubeconfig' get node '$node_name' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" = True ]" \
  || die "Node $node_name did not become Ready"
cat > "$node/node.env" << EOF
NODE_NAME=$node_name
NODE_ADDRESS=$address
CONTAINERD_SOCKET=$node/containerd.sock
KUBELET_ROOT=$kubelet_root
KUBELET_HEALTHZ=http://127.0.0.1:$kubelet_healthz/healthz
EOF
touch "$node/.running"
log "node $node_name Ready: kubelet $("$kbin/kubelet" --version | cut -d' ' -f2), containerd $("$rbin/containerd" --version | cut -d' ' -f3), $(runc --version | head -n1), CNI bridge $pod_cidr (logs in $node/logs)"
