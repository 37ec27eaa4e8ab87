#!/usr/bin/env bash
# Render one host's tokpipe.yaml from deploy/host.yaml.in (README "Several
# hosts"). The same file serves systemd (/etc/tokpipe/tokpipe.yaml) and
# deploy/netns-cluster.sh.
#
#   deploy/host-config.sh ROLE BROKER_ADDR KEYDIR [MODEL [TOKENIZER]] > tokpipe.yaml
#
# ROLE: broker (binds BROKER_ADDR; KEYDIR holds broker.key, broker.pub,
# client_keys, worker_keys), worker (KEYDIR holds broker.pub and its own
# worker.key) or client (broker.pub and client.key). MODEL and TOKENIZER
# must be absolute paths on that host (under systemd the working directory
# is /). Environment: RUNTIME_DIR ("" = /run/tokpipe under systemd),
# FORWARD_THREADS (0 = one per CPU).
set -euo pipefail
usage() { sed -n '5,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 3 ] && [ $# -le 5 ] || usage
role=$1 broker=$2 keydir=$3
model=${4:-/var/lib/tokpipe/model.bin} tokenizer=${5:-}
case "$broker" in *[!0-9A-Za-z.:-]*|"") echo "host-config: bad broker address '$broker'" >&2; exit 2 ;; esac
case "$keydir" in /*) ;; *) echo "host-config: KEYDIR must be absolute: $keydir" >&2; exit 2 ;; esac
sk="" ck="" wk="" csk=""
case "$role" in
  broker) sk=$keydir/broker.key ck=$keydir/client_keys wk=$keydir/worker_keys ;;
  worker) csk=$keydir/worker.key ;;
  client) csk=$keydir/client.key ;;
  *) echo "host-config: ROLE is broker, worker or client, not '$role'" >&2; exit 2 ;;
esac
tmpl=$(dirname "$0")/host.yaml.in
sed -e "s|@RUNTIME_DIR@|${RUNTIME_DIR:-}|" -e "s|@BROKER@|$broker|g" \
    -e "s|@MODEL@|$model|" -e "s|@TOKENIZER@|$tokenizer|" \
    -e "s|@FORWARD_THREADS@|${FORWARD_THREADS:-0}|" \
    -e "s|@SERVER_SECRET_KEY@|$sk|" -e "s|@CLIENT_KEYS@|$ck|" -e "s|@WORKER_KEYS@|$wk|" \
    -e "s|@CLIENT_SECRET_KEY@|$csk|" -e "s|@KEYDIR@|$keydir|g" "$tmpl"
