#!/usr/bin/env bash
# A tokpipe cluster on one machine: network namespaces for a broker host,
# worker hosts and a client host, each with one veth into a bridge that
# lives in a namespace of its own (nothing is added to the machine's own
# network: no address, no route, no interface). Each host gets its own
# CURVE key and its own tokpipe.yaml rendered by deploy/host-config.sh, the
# file a real host would use under the systemd units (README "Several
# hosts"). Needs root and iproute2 (`ip netns`).
#
#   deploy/netns-cluster.sh up        make the hosts, keys and configs; start
#                                     tokpiped --no-spawn on the broker host
#                                     and one worker per stage on each worker
#                                     host; wait until all have registered
#   deploy/netns-cluster.sh status    namespaces, processes, the broker's counters
#   deploy/netns-cluster.sh exec HOST CMD...   run CMD on HOST (broker, w1.., client);
#                                     $TPN_CONFIG is that host's tokpipe.yaml
#   deploy/netns-cluster.sh generate ARGS...   tokpipe generate from the client host
#   deploy/netns-cluster.sh cut HOST  take HOST's bridge port down (no FIN, no RST:
#                                     its packets are lost until restore)
#   deploy/netns-cluster.sh restore HOST       bring it back up
#   deploy/netns-cluster.sh down      stop everything, delete the namespaces
#
# Environment: TPN_TAG (name prefix of the namespaces, default tpn; up
# removes what an earlier run with the same tag left), TPN_DIR (keys,
# configs, logs; default /tmp/$TPN_TAG), TPN_WORKERS (worker hosts, default
# 2), TPN_NET (the /24's first three octets, default 10.231.0), TPN_BIN
# (the programs, default bin), TPN_MODEL and TPN_TOKENIZER (default
# ../shared/models/stories260K.bin and tok512.bin), TPN_STAGES (processes
# per worker host, default "tokenize forward sample stop"),
# TPN_FORWARD_THREADS (default 1).
set -euo pipefail

TAG=${TPN_TAG:-tpn}
DIR=${TPN_DIR:-/tmp/$TAG}
NW=${TPN_WORKERS:-2}
NET=${TPN_NET:-10.231.0}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN=$(cd "${TPN_BIN:-$ROOT/bin}" && pwd)
MODEL=$(realpath "${TPN_MODEL:-$ROOT/../shared/models/stories260K.bin}")
TOKENIZER=$(realpath "${TPN_TOKENIZER:-$ROOT/../shared/models/tok512.bin}")
STAGES=${TPN_STAGES:-tokenize forward sample stop}
BRNS=$TAG-net

die() { echo "netns-cluster: $*" >&2; exit 1; }
case "$TAG" in *[!a-z0-9-]*|"") die "TPN_TAG must be [a-z0-9-]: '$TAG'" ;; esac
case "$NW" in [1-9]) ;; *) die "TPN_WORKERS must be 1-9: '$NW'" ;; esac

hosts() { echo broker; for i in $(seq 1 "$NW"); do echo "w$i"; done; echo client; }
addr() {   # host -> its address on the bridge
  case "$1" in broker) echo "$NET.1" ;; client) echo "$NET.100" ;; w[1-9]) echo "$NET.$((10 + ${1#w}))" ;;
    *) die "no host '$1' (broker, w1..w$NW, client)" ;; esac
}
ns() { addr "$1" >/dev/null; echo "$TAG-$1"; }

# Processes in our namespaces only (we started them), TERM then KILL.
stop_ns_pids() {
  local n pids=() p
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$TAG-" || true); do
    for p in $(ip netns pids "$n" 2>/dev/null); do pids+=("$p"); done
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 50); do   # 5 s
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

down() {
  stop_ns_pids
  local n
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$TAG-" || true); do
    ip netns del "$n" 2>/dev/null || true
  done
}

net_up() {
  ip netns add "$BRNS"
  ip -n "$BRNS" link set lo up
  ip -n "$BRNS" link add br0 type bridge
  ip -n "$BRNS" link set br0 up
  local h n
  for h in $(hosts); do
    n=$(ns "$h")
    ip netns add "$n"
    ip -n "$n" link set lo up
    # both ends made where they live: nothing passes through the machine's namespace
    ip -n "$n" link add eth0 type veth peer name "p-$h" netns "$BRNS"
    ip -n "$BRNS" link set "p-$h" master br0 up
    ip -n "$n" addr add "$(addr "$h")/24" dev eth0
    ip -n "$n" link set eth0 up
  done
}

keys() {
  local h kd
  umask 077
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  for h in $(hosts); do mkdir -p "$DIR/$h/keys" "$DIR/$h/run"; done
  "$BIN/tokpipe" keygen --out "$DIR/broker/keys/broker" >/dev/null
  : > "$DIR/broker/keys/worker_keys"
  : > "$DIR/broker/keys/client_keys"
  for h in $(hosts); do
    kd=$DIR/$h/keys
    [ "$h" = broker ] && continue
    cp "$DIR/broker/keys/broker.pub" "$kd/broker.pub"
    # each host makes its own pair; only the .pub travels to the broker
    if [ "$h" = client ]; then
      "$BIN/tokpipe" keygen --out "$kd/client" >/dev/null
      cat "$kd/client.pub" >> "$DIR/broker/keys/client_keys"
    else
      "$BIN/tokpipe" keygen --out "$kd/worker" >/dev/null
      cat "$kd/worker.pub" >> "$DIR/broker/keys/worker_keys"
    fi
  done
  for h in $(hosts); do
    local role=worker
    case "$h" in broker|client) role=$h ;; esac
    RUNTIME_DIR=$DIR/$h/run FORWARD_THREADS=${TPN_FORWARD_THREADS:-1} \
      "$HERE/host-config.sh" "$role" "$NET.1" "$DIR/$h/keys" "$MODEL" "$TOKENIZER" > "$DIR/$h/tokpipe.yaml"
  done
}

start() {   # host name program args...: in the host's namespace, logging to $DIR/host/name.log
  local h=$1 name=$2; shift 2
  ip netns exec "$(ns "$h")" setsid "$@" </dev/null >"$DIR/$h/$name.log" 2>&1 &
}

stats() { ip netns exec "$(ns client)" "$BIN/tokpipe" stats --json --config "$DIR/client/tokpipe.yaml" --timeout 2000; }

wait_registered() {   # every stage has NW workers, within 60 s
  local want=$NW s
  for _ in $(seq 1 120); do
    if s=$(stats 2>/dev/null) && python3 - "$want" "$STAGES" "$s" <<'EOF'
import json, sys
want, s = int(sys.argv[1]), json.loads(sys.argv[3])
stages = [st for entry in sys.argv[2].split() for st in entry.replace(":", ",").split(",")]
sys.exit(0 if all(s["workers"].get(st, 0) >= want for st in stages) else 1)
EOF
    then return 0; fi
    sleep 0.5
  done
  return 1
}

up() {
  command -v ip >/dev/null || die "ip (iproute2) not found"
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
  down
  # a failed start leaves nothing behind
  trap 'rc=$?; [ $rc -eq 0 ] || down; exit $rc' EXIT
  rm -rf "$DIR"
  net_up
  keys
  start broker tokpiped "$BIN/tokpiped" --config "$DIR/broker/tokpipe.yaml" --no-spawn
  local h st
  for h in $(hosts); do
    case "$h" in w*) ;; *) continue ;; esac
    for st in $STAGES; do
      start "$h" "$st" "$BIN/tokpipe-worker" --config "$DIR/$h/tokpipe.yaml" --stage "$st" --instance "$h-$st"
    done
  done
  wait_registered || { status >&2 || true; die "workers did not all register within 60 s (logs in $DIR)"; }
  trap - EXIT
  echo "netns-cluster: up: broker $NET.1, $NW worker hosts, client $NET.100 (configs and logs in $DIR)"
}

status() {
  local n
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$TAG-" || true); do
    echo "$n: $(ip -n "$n" -br addr show dev eth0 2>/dev/null | awk '{print $2, $3}') pids: $(ip netns pids "$n" | tr '\n' ' ')"
  done
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(ns client)" && stats
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  exec)
    [ $# -ge 2 ] || die "exec HOST CMD..."
    h=$1; shift
    TPN_CONFIG=$DIR/$h/tokpipe.yaml exec ip netns exec "$(ns "$h")" "$@" ;;
  generate) exec ip netns exec "$(ns client)" "$BIN/tokpipe" generate --config "$DIR/client/tokpipe.yaml" "$@" ;;
  cut|restore)
    [ $# -eq 1 ] || die "$cmd HOST"
    ns "$1" >/dev/null
    state=down; [ "$cmd" = restore ] && state=up
    ip -n "$BRNS" link set "p-$1" "$state" ;;
  *) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
