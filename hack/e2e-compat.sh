#!/usr/bin/env bash
# `make e2e-compat`: muster against every Kubernetes version it claims. For each version
# (MUSTER_COMPAT_VERSIONS, oldest first) the control plane is built when missing (cached by
# version, tools/k8s/build.sh), then on it: the e2e subset covering compile, webhooks, gang
# admission and GPU indices (MUSTER_COMPAT_TESTS), the demo check, and the chart's tests (render
# and install). Logs go to target/compat/<version>-*.log; a table at the end says, per version,
# what ran and passed and what the control plane served (the features muster finds and uses).
# An entry VERSION+GATES (e.g. `1.37.2+GenericWorkload,WorkloadWithJob`) runs that version
# with only those feature gates on (MUSTER_FEATURE_GATES) and only the e2e tests that adapt to
# what is served (MUSTER_COMPAT_GATED_TESTS, default operating::): upstream mode where the
# native kinds are served but some of their gated fields are dropped.
# Exit status 0 only when everything passed on every version.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
versions=${MUSTER_COMPAT_VERSIONS:-1.30.14 1.34.4 1.37.2 1.37.2+GenericWorkload,WorkloadWithJob}
gated_tests=${MUSTER_COMPAT_GATED_TESTS:-operating::}
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
  local fields=""
  if [ -f "${2:-}" ]; then
    grep -q 'native PodGroups keep schedulingConstraints and resourceClaims' "$2" && fields="; native PodGroup fields: all kept"
    grep -q 'drops these native PodGroup fields' "$2" && fields="; native PodGroup fields dropped: $(grep -o 'drops these native PodGroup fields.*' "$2" | head -n 1 | grep -oE 'schedulingConstraints|resourceClaims' | sort -u | paste -sd, -)"
  fi
  echo "count-based GPUs: yes; DRA: $dra; upstream mode: $upstream$fields"
}

rc=0
summary=()
for entry in $versions; do
  v=${entry%%+*}
  run_tests=$tests
  unset MUSTER_FEATURE_GATES
  if [ "$entry" != "$v" ]; then
    export MUSTER_FEATURE_GATES=${entry#*+}
    run_tests=$gated_tests
  fi
  export MUSTER_K8S_VERSION=$v
  label=$entry
  [ "$entry" != "$v" ] && label="$v (gates ${entry#*+})"
  key=${entry//[,+]/-}
  log "Kubernetes $label: control plane"
  if ! bin=$(bash tools/k8s/build.sh 2> "$out/$key-build.log"); then
    log "Kubernetes $label: the control plane did not build (see $out/$key-build.log)"
    summary+=("| $label | build failed | - | - | - |")
    rc=1
    continue
  fi
  log "Kubernetes $label: e2e $run_tests"
  cargo build --bins > "$out/$key-plugin.log" 2>&1 || rc=1
  MUSTER_K8S_BIN=$bin cargo test -p muster --test e2e -- --test-threads=4 $run_tests > "$out/$key-e2e.log" 2>&1 || rc=1
  e2e="$(counts "$out/$key-e2e.log") ($run_tests)"
  # The cluster of that run: its features.txt says what the apiserver served, muster's log what
  # muster made of it.
  cluster=$(ls -td target/e2e-cluster-*/ 2> /dev/null | head -n 1)
  cluster=${cluster%/}
  [ -n "$cluster" ] && [ -f "$cluster/features.txt" ] && cp "$cluster/features.txt" "$out/$key-features.txt"
  [ -n "$cluster" ] && [ -f "$cluster/logs/muster.log" ] \
    && grep -hE 'is not served|compile to this scheduling API|DRA|native PodGroup' "$cluster"/logs/muster*.log | sort -u | head -n 20 > "$out/$key-muster-said.log"
  for d in target/e2e-cluster-*; do
    [ -d "$d" ] && [ ! -e "/proc/${d##*-}" ] && MUSTER_CLUSTER_DIR="$d" bash hack/cluster-down.sh > /dev/null 2>&1
  done
  demo=- chart=-
  if [ "$entry" = "$v" ]; then
    log "Kubernetes $label: demo check"
    if MUSTER_DEMO_PROFILE=debug make --no-print-directory demo-check > "$out/$key-demo.log" 2>&1; then demo=passed; else demo=failed; rc=1; fi
    log "Kubernetes $label: chart"
    MUSTER_K8S_BIN=$bin cargo test -p muster --test chart > "$out/$key-chart.log" 2>&1 || rc=1
    chart=$(counts "$out/$key-chart.log")
    for d in target/e2e-cluster-*; do
      [ -d "$d" ] && [ ! -e "/proc/${d##*-}" ] && MUSTER_CLUSTER_DIR="$d" bash hack/cluster-down.sh > /dev/null 2>&1
    done
  fi
  summary+=("| $label | $e2e | $demo | $chart | $(features "$out/$key-features.txt" "$out/$key-muster-said.log") |")
done
unset MUSTER_FEATURE_GATES

{
  echo "| Kubernetes | e2e passed/run (tests) | demo check | chart tests passed/run | available |"
  echo "| --- | --- | --- | --- | --- |"
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.md"
exit $rc
