#!/usr/bin/env bash
# Run each libFuzzer target given for FUZZ_SECONDS, starting from its seed
# corpus fuzz/corpus/<name>/ (committed) and a scratch corpus in FUZZ_BUILD.
set -eu
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
export TP_MODELS=${TP_MODELS:-$(cd ../shared/models 2>/dev/null && pwd)}
for bin in "$@"; do
  name=$(basename "$bin")
  work="$FUZZ_BUILD/corpus/$name"; mkdir -p "$work"
  seeds="fuzz/corpus/$name"; [ -d "$seeds" ] || seeds=""
  echo "== fuzz $name for ${FUZZ_SECONDS}s"
  "$bin" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$FUZZ_BUILD/" "$work" $seeds 2>&1 | tail -n 12
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fuzz $name: FAILED"; exit 1; }
done
