#!/usr/bin/env bash
# A test host: a network namespace joined to this machine by a veth pair, so that a process run
# in it (`ip netns exec`) listens on an address that is neither loopback (an EndpointSlice may not
# name 127.0.0.0/8) nor anyone else's. Used by the in-cluster webhook tests (tests/service).
#
#   hack/testhost.sh up DIR OWNER_PID   namespace muster-th-OWNER_PID, 198.51.100.2/24 inside,
#                                       198.51.100.1/24 on this side (interface mthOWNER_PIDh);
#                                       writes DIR/testhost.env
#   hack/testhost.sh down DIR           stops every process in it and deletes it (the veth pair
#                                       goes with it); fails if anything is left
#
# Needs root and iproute2 (`ip`), and fails saying so without them. Only TEST-NET-2
# (198.51.100.0/24, documentation) is used, and only .1 and .2, so there is one test host per
# machine at a time, recorded in /run/muster-testhost.owner: `up` waits (MUSTER_TESTHOST_WAIT
# seconds, default 300) while a live process owns it, and first removes what a dead owner left.
# hack/cluster-down.sh runs `down` for a cluster folder holding testhost.env.
set -euo pipefail

HOST_IP=198.51.100.1
GUEST_IP=198.51.100.2
PREFIX=24
OWNER_FILE=/run/muster-testhost.owner
LOCK_FILE=/run/muster-testhost.lock

log() { echo "testhost: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Field 22 of /proc/PID/stat (start time) tells PID apart from a later process reusing it.
start_time() {
  local stat fields
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 0
  read -r -a fields <<< "${stat##*) }"
  echo "${fields[19]}"
}

# Stops the processes in namespace $1 (SIGTERM, SIGKILL after 10 s), deletes it and host-side
# interface $2; fails when either is still there.
teardown() {
  local netns=$1 host_if=$2 pids deadline=$((SECONDS + 10))
  if ip netns list | grep -qE "^$netns( |$)"; then
    pids=$(ip netns pids "$netns" 2> /dev/null || true)
    if [ -n "$pids" ]; then
      log "stopping process(es) in $netns: $(echo $pids)"
      # shellcheck disable=SC2086
      kill -TERM $pids 2> /dev/null || true
      while [ -n "$(ip netns pids "$netns" 2> /dev/null)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
      pids=$(ip netns pids "$netns" 2> /dev/null || true)
      # shellcheck disable=SC2086
      [ -z "$pids" ] || { log "killing $(echo $pids)"; kill -KILL $pids 2> /dev/null || true; sleep 0.5; }
    fi
    ip netns del "$netns" 2> /dev/null || true
  fi
  ip link del "$host_if" 2> /dev/null || true
  ! ip netns list | grep -qE "^$netns( |$)" || die "network namespace $netns is still there"
  ! ip link show "$host_if" > /dev/null 2>&1 || die "interface $host_if is still there"
}

need() {
  [ "$(id -u)" = 0 ] || die "must run as root (network namespaces and veth pairs)"
  command -v ip > /dev/null || die "'ip' not found: install iproute2"
  command -v flock > /dev/null || die "'flock' not found: install util-linux"
}

up() {
  local dir=$1 owner=$2 netns host_if guest_if wait deadline started
  [ -d "$dir" ] || die "no folder $dir"
  started=$(start_time "$owner")
  [ -n "$started" ] || die "owner process $owner is not running"
  netns=muster-th-$owner
  host_if=mth${owner}h
  guest_if=mth${owner}g
  wait=${MUSTER_TESTHOST_WAIT:-300}
  deadline=$((SECONDS + wait))
  exec 8> "$LOCK_FILE"
  while :; do
    flock -w "$wait" 8 || die "could not lock $LOCK_FILE within ${wait}s"
    [ -f "$OWNER_FILE" ] || break
    local o_netns o_if o_pid o_start o_dir
    read -r o_netns o_if o_pid o_start o_dir < "$OWNER_FILE"
    if [ "$(start_time "$o_pid")" != "$o_start" ]; then
      log "removing the test host of ended process $o_pid ($o_netns, cluster $o_dir)"
      teardown "$o_netns" "$o_if"
      rm -f "$OWNER_FILE" "$o_dir/testhost.env"
      break
    fi
    [ "$o_pid" != "$owner" ] || die "process $owner already owns the test host $o_netns"
    flock -u 8
    [ $SECONDS -lt $deadline ] || die "process $o_pid ($o_dir) still owns the test host after ${wait}s"
    log "waiting for process $o_pid ($o_dir) to give the test host back"
    sleep 2
  done
  if ip -o -4 addr show | grep -qE " inet ${HOST_IP//./\\.}/"; then
    die "$HOST_IP is already on an interface this script did not record: $(ip -o -4 addr show | grep -F " $HOST_IP/" | cut -d' ' -f2)"
  fi

  echo "$netns $host_if $owner $started $dir" > "$OWNER_FILE"
  trap 'teardown "$netns" "$host_if" || true; rm -f "$OWNER_FILE"' EXIT
  ip netns add "$netns"
  ip link add "$host_if" type veth peer name "$guest_if"
  # No IPv6 link-local addresses: the two IPv4 addresses are all there is.
  ip link set "$host_if" addrgenmode none
  ip link set "$guest_if" netns "$netns"
  ip -n "$netns" link set "$guest_if" addrgenmode none
  ip addr add "$HOST_IP/$PREFIX" dev "$host_if"
  ip link set "$host_if" up
  ip -n "$netns" addr add "$GUEST_IP/$PREFIX" dev "$guest_if"
  ip -n "$netns" link set "$guest_if" up
  ip -n "$netns" link set lo up
  # The pair carries traffic once both ends are up.
  local tries=0
  until ip -n "$netns" -o link show "$guest_if" | grep -q "state UP"; do
    tries=$((tries + 1))
    [ $tries -lt 50 ] || die "$guest_if did not come up"
    sleep 0.1
  done
  cat > "$dir/testhost.env" << EOF
TESTHOST_NETNS=$netns
TESTHOST_HOST_IF=$host_if
TESTHOST_HOST_IP=$HOST_IP
TESTHOST_GUEST_IP=$GUEST_IP
TESTHOST_OWNER=$owner
EOF
  trap - EXIT
  log "network namespace $netns: $GUEST_IP inside, $HOST_IP on $host_if"
}

down() {
  local dir=$1 env=$1/testhost.env TESTHOST_NETNS TESTHOST_HOST_IF
  # Absent, or removed meanwhile by another `down` (the watchdog's and make's cluster-down race).
  # shellcheck disable=SC1090
  source "$env" 2> /dev/null || exit 0
  teardown "$TESTHOST_NETNS" "$TESTHOST_HOST_IF"
  exec 8> "$LOCK_FILE"
  flock -w 30 8 || log "could not lock $LOCK_FILE; leaving $OWNER_FILE"
  if [ -f "$OWNER_FILE" ] && [ "$(cut -d' ' -f1 "$OWNER_FILE")" = "$TESTHOST_NETNS" ]; then
    rm -f "$OWNER_FILE"
  fi
  rm -f "$env"
  log "removed network namespace $TESTHOST_NETNS"
}

need
case "${1:-}" in
  up) up "${2:?usage: testhost.sh up DIR OWNER_PID}" "${3:?usage: testhost.sh up DIR OWNER_PID}" ;;
  down) down "${2:?usage: testhost.sh down DIR}" ;;
  *) die "usage: testhost.sh up DIR OWNER_PID | down DIR" ;;
esac
