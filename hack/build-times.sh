#!/usr/bin/env bash
# Build times of one commit of muster, as issue 39 measured them (the numbers are in its closing
# note): in a git worktree of REF with a target folder of its own,
#   release: a clean `cargo build --release`, then after touching one controller file, then after
#            touching one core file (release builds are not incremental: a touch rebuilds the
#            crate and everything above it);
#   debug:   a full `cargo build`, then after a one-line edit in the job reconcile (a reason
#            string) and after a one-line edit in placement's GPU need (a condition), each undone.
#
#   hack/build-times.sh [REF] [release|debug|all]     (default: HEAD all)
#
# It takes the machine for about 15 minutes (release) and 5 (debug) on 2 cores: run it on a
# quiet machine. Results: target/build-times/<ref>/times.txt and cargo's --timings reports.
set -uo pipefail
ref=${1:-HEAD}
what=${2:-all}
root=$(cd "$(dirname "$0")/.." && pwd)
sha=$(git -C "$root" rev-parse --short "$ref") || exit 2
out=$root/target/build-times/$sha
tree=$out/tree
mkdir -p "$out"
[ -d "$tree" ] || git -C "$root" worktree add --detach "$tree" "$sha" > /dev/null || exit 2
cd "$tree" || exit 2
export CARGO_TARGET_DIR=$out/target

# The files the issue names: a controller file and a core file, where this commit has them.
ctl=src/controllers/job/mod.rs
core=crates/muster-core/src/scheduler/placement.rs
[ -f "$core" ] || core=src/scheduler/placement.rs
# The one-line edits, wherever this commit keeps the two lines.
edit_ctl=$(grep -rl '"NamespaceExcluded", &message, now, None' src/controllers/job | head -1)
edit_core=$(grep -rl '        if shape.gpus > 0 {' crates/muster-core/src/scheduler/placement* src/scheduler/placement* 2>/dev/null | head -1)

timed() { # log name, label, command...
  local log=$1 label=$2 s e rc
  shift 2
  s=$(date +%s.%N)
  "$@" > "$out/$log.log" 2>&1
  rc=$?
  e=$(date +%s.%N)
  printf '%-48s rc=%d %6.1f s\n' "$label" "$rc" "$(echo "$e - $s" | bc)" | tee -a "$out/times.txt"
}

if [ "$what" = release ] || [ "$what" = all ]; then
  rm -rf "$CARGO_TARGET_DIR/release"
  timed release-clean release-clean cargo build --release --timings
  touch "$ctl"
  timed release-touch-controller "release-touch-controller ($ctl)" cargo build --release --timings
  touch "$core"
  timed release-touch-core "release-touch-core ($core)" cargo build --release --timings
fi
if [ "$what" = debug ] || [ "$what" = all ]; then
  timed debug-full debug-full cargo build
  if [ -n "$edit_ctl" ]; then
    sed -i 's/"NamespaceExcluded", &message, now, None/"NamespaceExcluded!", \&message, now, None/' "$edit_ctl"
    timed debug-edit-controller "debug-edit-controller ($edit_ctl)" cargo build
    git checkout -q -- "$edit_ctl" && cargo build > /dev/null 2>&1
  fi
  if [ -n "$edit_core" ]; then
    sed -i 's/        if shape.gpus > 0 {/        if shape.gpus > 0 \&\& shape.gpus < u32::MAX {/' "$edit_core"
    timed debug-edit-core "debug-edit-core ($edit_core)" cargo build
    git checkout -q -- "$edit_core" && cargo build > /dev/null 2>&1
  fi
fi
echo "build-times: $out/times.txt"
