#!/usr/bin/env bash
# Makes sure mdBook (the documentation tool `make docs` and `make docs-check` build the book
# with) is installed at the pinned version, and prints the binary's path on stdout.
#   hack/mdbook.sh        -> $cache/mdbook-0.5.4/bin/mdbook
# It is built from crates.io with the toolchain's cargo (`cargo install --locked`, only the
# search feature: no live-reload server), once per machine, into the same cache as the control
# plane binaries (tools/k8s/bindir.sh): MUSTER_CACHE_DIR, else $XDG_CACHE_HOME/muster, else
# ~/.cache/muster. A present binary of the right version is used as it is; two callers at once
# wait for one install (flock on the cache folder).
set -euo pipefail

MDBOOK_VERSION=0.5.4
cache=${MUSTER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/muster}
root="$cache/mdbook-$MDBOOK_VERSION"
bin="$root/bin/mdbook"
CARGO=${CARGO:-cargo}

installed() {
  [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "mdbook v$MDBOOK_VERSION" ]
}

if ! installed; then
  command -v "$CARGO" > /dev/null || { echo "hack/mdbook.sh: cargo not found (install Rust with rustup)" >&2; exit 1; }
  mkdir -p "$cache"
  exec 9> "$cache/mdbook-$MDBOOK_VERSION.lock"
  flock 9
  # Another caller may have installed it while this one waited for the lock.
  if ! installed; then
    echo "hack/mdbook.sh: installing mdBook $MDBOOK_VERSION into $root (once per machine, about 2 min)" >&2
    # --force: a binary there that is not this version (or does not run) is replaced.
    "$CARGO" install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features --features search \
      --force --root "$root" >&2
    installed || { echo "hack/mdbook.sh: $bin is not mdBook $MDBOOK_VERSION after the install" >&2; exit 1; }
  fi
fi
echo "$bin"
