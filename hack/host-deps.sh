#!/usr/bin/env bash
# The host packages the README's commands need, installed before any build starts.
#   hack/host-deps.sh test   what `make test` needs: the demo's tools, plus Prometheus (the GPU
#                            health e2e tests scrape a fake DCGM exporter with the Debian
#                            package's binary) and iproute2 (`make e2e-service` runs muster in a
#                            network namespace)
#   hack/host-deps.sh demo   what `make demo` needs: cargo and go (the control plane is built
#                            from the Go module proxy, see tools/k8s)
#   hack/host-deps.sh real   what `make e2e-real` needs besides: runc (Debian's; containerd,
#                            kubelet and the CNI plugins are built by tools/k8s/build-node.sh),
#                            iptables and conntrack (kube-proxy), busybox-static (the job pods'
#                            image, hack/image.sh busybox) and iproute2
# Missing Debian packages are installed when that is possible (root and apt-get present);
# otherwise it stops at once, exit 1, with the exact command to run. Toolchains are not
# installed here (rustup's cargo and the Go release are not Debian packages); a missing one is
# named with what to install.
set -euo pipefail
what=${1:-test}
# The make target that asked.
target=$what
[ "$what" != real ] || target=e2e-real
log() { echo "host-deps: $*" >&2; }

# command -> Debian package that provides it
declare -A package
case "$what" in
  demo) ;;
  test) package=([prometheus]=prometheus [ip]=iproute2) ;;
  real) package=([runc]=runc [iptables]=iptables [conntrack]=conntrack [busybox]=busybox-static [ip]=iproute2) ;;
  *) log "usage: hack/host-deps.sh test|demo|real"; exit 2 ;;
esac

for tool in cargo go; do
  if ! command -v "$tool" > /dev/null; then
    log "'$tool' not found on PATH: install the Rust toolchain (cargo, stable, edition 2024) and Go (the version tools/k8s/go.mod names), then run make again"
    exit 1
  fi
done

missing=()
for cmd in "${!package[@]}"; do
  command -v "$cmd" > /dev/null || missing+=("${package[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

install="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
  [ "$(id -u)" -eq 0 ] || install="sudo sh -c '$install'"
  log "missing Debian packages: ${missing[*]} (make $target needs them)"
  log "run: $install"
  log "then run make $target again"
  exit 1
fi

log "installing missing Debian packages: ${missing[*]}"
apt_log=$(mktemp -t muster-host-deps.XXXXXX)
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } > "$apt_log" 2>&1; then
  log "apt-get failed; last lines of $apt_log:"
  tail -n 20 "$apt_log" >&2
  log "fix that, or run '$install' yourself, then run make $target again"
  exit 1
fi
rm -f "$apt_log"
for cmd in "${!package[@]}"; do
  command -v "$cmd" > /dev/null || { log "'$cmd' still not on PATH after installing ${package[$cmd]}"; exit 1; }
done
log "installed ${missing[*]}"
