#!/usr/bin/env bash
# Usage: e2e-rbac-check.sh CLUSTER_DIR
# After `make e2e-rbac`: fails when the logs of muster (logs/muster.log, and logs/muster-extra-*.log
# of the tests that run their own) show a request of muster's that the apiserver refused
# ("forbidden") or a CA bundle it could not inject. Two kinds of "forbidden" are not about
# muster's rights and are left out: muster's own webhook denying an object (a field error may
# read "Forbidden: ..."), and the NamespaceLifecycle admission plugin refusing new objects in a
# test's namespace that is being deleted (muster still reconciles its jobs then).
set -euo pipefail

dir=${1:?usage: e2e-rbac-check.sh CLUSTER_DIR}
logs=("$dir"/logs/muster.log "$dir"/logs/muster-extra-*.log)
[ -s "${logs[0]}" ] || { echo "e2e-rbac: no muster log at ${logs[0]}" >&2; exit 1; }
runs=0
for log in "${logs[@]}"; do
  [ -e "$log" ] || continue
  # Each start's first line names its kubeconfig; the ServiceAccount's is <namespace>-muster.kubeconfig.
  other=$(grep '^=== e2e: ' "$log" | grep -v -e '-muster\.kubeconfig$' || true)
  if [ -n "$other" ]; then
    echo "e2e-rbac: $log: muster did not run with the chart's ServiceAccount: $other" >&2
    exit 1
  fi
  runs=$((runs + $(grep -c '^=== e2e: ' "$log")))
done
refused=$(grep -i -e forbidden -e 'could not inject the CA bundle' "${logs[@]}" 2> /dev/null \
  | grep -v -e 'muster::webhook: denied' -e 'because it is being terminated' || true)
if [ -n "$refused" ]; then
  echo "$refused"
  echo "e2e-rbac: muster was refused with the chart's RBAC (logs in $dir/logs)" >&2
  exit 1
fi
echo "e2e-rbac: $runs muster start(s) as the chart's ServiceAccount, nothing refused (logs in $dir/logs)"
