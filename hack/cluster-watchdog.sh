#!/usr/bin/env bash
# Usage: cluster-watchdog.sh PID
# Waits until process PID is gone (however it ended: exit, panic, SIGKILL), then runs
# hack/cluster-down.sh for MUSTER_CLUSTER_DIR. The e2e harness starts one per test run in its
# own process group, so a Ctrl-C aimed at the tests does not stop it before its work is done.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pid=${1:?usage: cluster-watchdog.sh PID}
: "${MUSTER_CLUSTER_DIR:?MUSTER_CLUSTER_DIR must name the cluster folder}"

# Field 22 of /proc/PID/stat is the start time: it tells PID apart from a later process reusing
# it. Fields are counted after the command name, which is in parentheses and may hold spaces.
start_time() {
  local stat fields
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 0
  read -r -a fields <<< "${stat##*) }"
  echo "${fields[19]}"
}
started=$(start_time "$pid")
[ -n "$started" ] || echo "cluster-watchdog: process $pid is already gone"
echo "cluster-watchdog: watching $pid for $MUSTER_CLUSTER_DIR"
while [ -n "$started" ] && [ "$(start_time "$pid")" = "$started" ]; do
  sleep 0.5
done
echo "cluster-watchdog: $pid is gone; stopping the cluster"
exec bash "$root/hack/cluster-down.sh"
