#!/usr/bin/env bash
# `make run`: start tokpiped (which spawns and supervises one worker process
# per stage) on the real stories260K model, stream a sample job to the
# terminal with `tokpipe generate`, run a few concurrent jobs, print the
# broker's counters, then shut the daemon down cleanly (SIGTERM: drain,
# stop workers, exit 0).
set -euo pipefail
BIN=${BIN:-bin}
MODELS=${TP_MODELS:-../shared/models}
for f in stories260K.bin tok512.bin; do
  [ -r "$MODELS/$f" ] || { echo "run-demo: $MODELS/$f not found (set TP_MODELS)" >&2; exit 1; }
done
MODELS=$(cd "$MODELS" && pwd)

# A private runtime directory, so the demo never touches another daemon's
# sockets; everything else is config/tokpipe.yaml's defaults.
DIR=$(mktemp -d /tmp/tokpipe-demo.XXXXXX)
CFG=$DIR/tokpipe.yaml
cat > "$CFG" <<YAML
runtime_dir: $DIR/run
model:
  path: $MODELS/stories260K.bin
  tokenizer: $MODELS/tok512.bin
YAML

DPID=""
cleanup() {
  if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then
    kill -TERM "$DPID"; wait "$DPID" || true
  fi
  rm -rf "$DIR"
}
trap cleanup EXIT

echo "== starting: $BIN/tokpiped --config $CFG   (log: $DIR/tokpiped.log)"
"$BIN/tokpiped" --config "$CFG" 2>"$DIR/tokpiped.log" &
DPID=$!

# Wait until a worker of every stage has registered.
for _ in $(seq 1 100); do
  if "$BIN/tokpipe" stats --config "$CFG" --timeout 500 2>/dev/null |
       awk '/^workers\./ { if ($2 + 0 < 1) bad = 1; n++ } END { exit !(n == 4 && !bad) }'; then
    break
  fi
  sleep 0.1
done

echo "== streaming one job (greedy, 200 tokens):"
echo
printf 'Once upon a time'
"$BIN/tokpipe" generate --config "$CFG" --prompt "Once upon a time" --temperature 0 --max-tokens 200
echo
echo
echo "== three concurrent jobs, sampled, stopping at the first full stop:"
"$BIN/tokpipe" generate --config "$CFG" --json --temperature 0.8 --seed 42 --max-tokens 64 --stop "." \
  --prompt "The little dog" --prompt "Lily found a box" --prompt "The sun was hot"
echo
echo "== broker counters:"
"$BIN/tokpipe" stats --config "$CFG"

echo
echo "== the same over HTTP: tokpipe-http, spawned by tokpiped (http: in the config), streams SSE"
echo "   curl -N http://127.0.0.1:8080/v1/completions -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0, \"stream\": true}'"
for _ in $(seq 1 50); do
  curl -sf http://127.0.0.1:8080/health >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sN --max-time 30 http://127.0.0.1:8080/v1/completions \
  -d '{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": true}' ||
  echo "(no gateway on 127.0.0.1:8080: is another program using the port? see $DIR/tokpiped.log)"
echo

echo
echo "== shutting down (SIGTERM)"
kill -TERM "$DPID"
if wait "$DPID"; then
  echo "tokpiped exited cleanly"
else
  rc=$?; echo "tokpiped exited with status $rc; log:" >&2; cat "$DIR/tokpiped.log" >&2; exit "$rc"
fi
DPID=""
