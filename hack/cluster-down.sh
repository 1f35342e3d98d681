#!/usr/bin/env bash
# Stops the cluster hack/cluster-up.sh started in MUSTER_CLUSTER_DIR (default target/cluster):
# every process named in its pid files, then any component process still running from that
# folder, then the test host (hack/testhost.sh) made for it, if any. A real node
# (hack/real-node.sh) started for it goes first: its kubelet is a client too. Keeps logs/,
# pki/ and the kubeconfig; removes the etcd data. Fails if a process or the test host survives.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${MUSTER_CLUSTER_DIR:-$root/target/cluster}
[ -d "$dir" ] || { echo "cluster-down: no cluster in $dir"; exit 0; }
dir=$(cd "$dir" && pwd)
pids=$dir/pids
# Stop order: the clients first (muster: the e2e harness's `muster run`), etcd last.
components=(muster kwok kube-controller-manager kube-scheduler kube-apiserver etcd)

log() { echo "cluster-down: $*" >&2; }

ours() { # pid -> is it a component process started for this folder?
  local pid=$1 cmd env
  [ -r "/proc/$pid/cmdline" ] || return 1
  cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null) || return 1
  local exe=${cmd%% *}
  case "${exe##*/}" in
    # prometheus: hack/prometheus.sh started with a folder inside this one (the e2e tests do).
    etcd | kube-apiserver | kube-scheduler | kube-controller-manager | kwok | prometheus)
      [[ " $cmd" == *" $dir/"* || "$cmd" == *"=$dir/"* ]] ;;
    # Its kubeconfig may live elsewhere (MUSTER_E2E_MUSTER_KUBECONFIG): the harness marks it
    # with MUSTER_CLUSTER_DIR in its environment instead.
    muster)
      env=$(tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null) || return 1
      grep -qxF "MUSTER_CLUSTER_DIR=$dir" <<< "$env" ;;
    *) return 1 ;;
  esac
}

stop() { # pid...: SIGTERM, wait up to 15 s, then SIGKILL
  local p deadline=$((SECONDS + 15)) left
  for p in "$@"; do kill -TERM "$p" 2> /dev/null || true; done
  while :; do
    left=()
    for p in "$@"; do ours "$p" && left+=("$p"); done
    [ ${#left[@]} -eq 0 ] && return 0
    if [ $SECONDS -ge $deadline ]; then
      log "killing ${left[*]} (did not stop on SIGTERM)"
      kill -KILL "${left[@]}" 2> /dev/null || true
      sleep 0.5
      return 0
    fi
    sleep 0.2
  done
}

if [ -d "$dir/node" ]; then
  MUSTER_CLUSTER_DIR=$dir bash "$root/hack/real-node.sh" down || { log "ERROR: the real node of $dir did not stop"; exit 1; }
fi

stopped=0
for c in "${components[@]}"; do
  f=$pids/$c.pid
  [ -f "$f" ] || continue
  pid=$(< "$f")
  if ours "$pid"; then
    stop "$pid"
    stopped=$((stopped + 1))
  fi
  rm -f "$f"
done

# Anything started for this folder that has no pid file any more (an interrupted cluster-up).
strays=()
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  ours "$p" && strays+=("$p")
done
if [ ${#strays[@]} -gt 0 ]; then
  log "stopping ${#strays[@]} process(es) without a pid file: ${strays[*]}"
  stop "${strays[@]}"
fi

left=()
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  ours "$p" && left+=("$p")
done
if [ ${#left[@]} -gt 0 ]; then
  log "ERROR: still running: ${left[*]}"
  exit 1
fi
if [ -f "$dir/testhost.env" ]; then
  bash "$root/hack/testhost.sh" down "$dir" || { log "ERROR: the test host of $dir is still there"; exit 1; }
fi
rm -rf "$dir/etcd"
log "stopped $((stopped + ${#strays[@]})) process(es) of $dir; none left"
