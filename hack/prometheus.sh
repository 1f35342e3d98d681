#!/usr/bin/env bash
# A throwaway Prometheus for tests and local runs (the Debian package's binary, never its service).
#
#   hack/prometheus.sh start DIR TARGET...   scrape each TARGET (host:port, /metrics) every second;
#                                            prints the base URL (http://127.0.0.1:PORT) last
#   hack/prometheus.sh stop DIR
#
# DIR holds everything: prometheus.yml, data/ (the TSDB), prometheus.log, prometheus.pid, url.
# It listens on a free 127.0.0.1 port. A DIR inside a cluster folder (MUSTER_CLUSTER_DIR) is also
# stopped by hack/cluster-down.sh. Starting again in a DIR whose Prometheus runs replaces it.
set -euo pipefail

log() { echo "prometheus.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { die "usage: $0 start DIR TARGET... | stop DIR"; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
shift 2

# Is PID the Prometheus of this DIR (guards against a recycled pid)?
ours() {
  local cmdline
  [ -r "/proc/$1/cmdline" ] || return 1
  cmdline=$(tr '\0' ' ' < "/proc/$1/cmdline" 2> /dev/null) || return 1
  [[ "$cmdline" == *"--storage.tsdb.path=$dir/data"* ]]
}

stop() {
  [ -f "$dir/prometheus.pid" ] || return 0
  local pid deadline=$((SECONDS + 15))
  pid=$(< "$dir/prometheus.pid")
  if ours "$pid"; then
    kill -TERM "$pid" 2> /dev/null || true
    while ours "$pid"; do
      if [ $SECONDS -ge $deadline ]; then
        log "killing $pid (did not stop on SIGTERM)"
        kill -KILL "$pid" 2> /dev/null || true
        break
      fi
      sleep 0.1
    done
  fi
  rm -f "$dir/prometheus.pid" "$dir/url"
}

case "$cmd" in
  start)
    [ $# -gt 0 ] || usage
    prometheus=${PROMETHEUS:-$(command -v prometheus || true)}
    [ -n "$prometheus" ] && [ -x "$prometheus" ] ||
      die "prometheus not found: install the Debian package (apt-get install -y prometheus; .ci/run does)"
    command -v python3 > /dev/null || die "python3 not found"
    command -v curl > /dev/null || die "curl not found"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    stop
    rm -rf "$dir/data"
    targets=$(printf '"%s", ' "$@")
    cat > "$dir/prometheus.yml" << EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: dcgm
    static_configs:
      - targets: [${targets%, }]
EOF
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    setsid "$prometheus" \
      --config.file="$dir/prometheus.yml" \
      --storage.tsdb.path="$dir/data" \
      --storage.tsdb.retention.time=1h \
      --web.listen-address="127.0.0.1:$port" \
      > "$dir/prometheus.log" 2>&1 < /dev/null &
    echo $! > "$dir/prometheus.pid"
    url=http://127.0.0.1:$port
    deadline=$((SECONDS + 60))
    until curl -sf "$url/-/ready" > /dev/null 2>&1; do
      # kill -0, not ours: until the child has exec'd prometheus its cmdline is this script's.
      if ! kill -0 "$(< "$dir/prometheus.pid")" 2> /dev/null; then
        log "prometheus exited; last lines of $dir/prometheus.log:"
        tail -n 20 "$dir/prometheus.log" >&2
        exit 1
      fi
      if [ $SECONDS -ge $deadline ]; then
        log "timed out waiting for $url/-/ready"
        tail -n 20 "$dir/prometheus.log" >&2
        stop
        exit 1
      fi
      sleep 0.2
    done
    echo "$url" > "$dir/url"
    log "ready at $url, scraping $* every 1s (log $dir/prometheus.log)"
    echo "$url"
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    dir=$(cd "$dir" && pwd)
    stop
    ;;
  *) usage ;;
esac
