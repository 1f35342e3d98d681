#!/usr/bin/env bash
# `make e2e-compat`: muster against every Kubernetes version it claims. For each version
# (MUSTER_COMPAT_VERSIONS, oldest first) the control plane is built when missing (cached by
# version, tools/k8s/build.sh), then on it: the e2e subset covering compile, webhooks, gang
# admission and GPU indices (MUSTER_COMPAT_TESTS), the demo check, and the chart's tests (render
# and install). Logs go to target/compat/<version>-*.log; a table at the end says, per version,
# what ran and passed and what the control plane served (the features muster finds and uses).
# Exit status 0 only when everything passed on every version.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
versions=${MUSTER_COMPAT_VERSIONS:-1.30.14 1.34.4 1.37.2}
tests=${MUSTER_COMPAT_TESTS:-jobs:: webhook:: admission:: gpus:: operating::}
out=$root/target/compat
mkdir -p "$out"
log() { echo "e2e-compat: $*" >&2; }

# "passed/run" from a cargo test log (the sums of its `test result:` lines).
counts() {
  awk '/^test result:/ {p += $4; f += $6} END {printf "%d/%d", p, p + f}' "$1"
}

# What a cluster served, from cluster-up's features.txt: DRA, upstream mode (the native
# Workload and PodGroup), what it dropped.
features() {
  local f=$1 dra=no upstream=no
  [ -f "$f" ] || { echo "unknown (no features.txt)"; return; }
  grep -q '^served resource.k8s.io/v1: .*resourceslices' "$f" && dra=yes
  grep -qE '^served scheduling.k8s.io/v1beta1: .*\bworkloads\b.*\bpodgroups\b|^served scheduling.k8s.io/v1beta1: .*\bpodgroups\b.*\bworkloads\b' "$f" && upstream=yes
  echo "count-based GPUs: yes; DRA: $dra; upstream mode: $upstream"
}

rc=0
summary=()
for v in $versions; do
  export MUSTER_K8S_VERSION=$v
  log "Kubernetes $v: control plane"
  if ! bin=$(bash tools/k8s/build.sh 2> "$out/$v-build.log"); then
    log "Kubernetes $v: the control plane did not build (see $out/$v-build.log)"
    summary+=("| $v | build failed | - | - | - |")
    rc=1
    continue
  fi
  log "Kubernetes $v: e2e $tests"
  MUSTER_K8S_BIN=$bin cargo test --test e2e -- --test-threads=4 $tests > "$out/$v-e2e.log" 2>&1 || rc=1
  e2e=$(counts "$out/$v-e2e.log")
  # The cluster of that run: its features.txt says what the apiserver served, muster's log what
  # muster made of it.
  cluster=$(ls -td target/e2e-cluster-*/ 2> /dev/null | head -n 1)
  cluster=${cluster%/}
  [ -n "$cluster" ] && [ -f "$cluster/features.txt" ] && cp "$cluster/features.txt" "$out/$v-features.txt"
  [ -n "$cluster" ] && [ -f "$cluster/logs/muster.log" ] \
    && grep -E 'is not served|compile to this scheduling API|DRA' "$cluster/logs/muster.log" | sort -u | head -n 20 > "$out/$v-muster-said.log"
  for d in target/e2e-cluster-*; do
    [ -d "$d" ] && [ ! -e "/proc/${d##*-}" ] && MUSTER_CLUSTER_DIR="$d" bash hack/cluster-down.sh > /dev/null 2>&1
  done
  log "Kubernetes $v: demo check"
  if MUSTER_DEMO_PROFILE=debug make --no-print-directory demo-check > "$out/$v-demo.log" 2>&1; then demo=passed; else demo=failed; rc=1; fi
  log "Kubernetes $v: chart"
  MUSTER_K8S_BIN=$bin cargo test --test chart > "$out/$v-chart.log" 2>&1 || rc=1
  chart=$(counts "$out/$v-chart.log")
  for d in target/e2e-cluster-*; do
    [ -d "$d" ] && [ ! -e "/proc/${d##*-}" ] && MUSTER_CLUSTER_DIR="$d" bash hack/cluster-down.sh > /dev/null 2>&1
  done
  summary+=("| $v | $e2e | $demo | $chart | $(features "$out/$v-features.txt") |")
done

{
  echo "| Kubernetes | e2e ($tests) passed/run | demo check | chart tests passed/run | available |"
  echo "| --- | --- | --- | --- | --- |"
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.md"
exit $rc
