#!/usr/bin/env bash
# Run each libFuzzer target given for FUZZ_SECONDS, starting from its seed
# corpus fuzz/corpus/<name>/ (committed) and a scratch corpus in FUZZ_BUILD.
# FUZZ_JOBS targets run at once (default: the CPUs), each on one core, so
# every target keeps its whole FUZZ_SECONDS while the run takes a fraction.
set -eu
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}
export TP_MODELS=${TP_MODELS:-$(cd ../shared/models 2>/dev/null && pwd)}

fuzz_one() {   # $1 = target binary; its summary goes to $FUZZ_BUILD/NAME.log
  local name work seeds
  name=$(basename "$1")
  work="$FUZZ_BUILD/corpus/$name"; mkdir -p "$work"
  seeds="fuzz/corpus/$name"; [ -d "$seeds" ] || seeds=""
  local rc=0
  {
    echo "== fuzz $name for ${FUZZ_SECONDS}s"
    # the whole output is kept aside: on a failure its crash report (the
    # sanitizer's stack, the artifact's name) is what a reader needs
    "$1" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$FUZZ_BUILD/" "$work" $seeds > "$FUZZ_BUILD/$name.full" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then tail -n 12 "$FUZZ_BUILD/$name.full"; else
      grep -v -e '^#[0-9]* *\(NEW\|REDUCE\|pulse\|INITED\|RELOAD\)' "$FUZZ_BUILD/$name.full" | tail -n 80
      echo "fuzz $name: FAILED"; exit 1
    fi
  } > "$FUZZ_BUILD/$name.log" 2>&1
}

mkdir -p "$FUZZ_BUILD"
names=()
for bin in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n || true; done
  rm -f "$FUZZ_BUILD/$(basename "$bin").log"
  fuzz_one "$bin" &
  names+=("$(basename "$bin")")
done
wait || true
# the passing targets' logs first, then the failing ones' and their names,
# so that a log cut to its tail (as CI keeps it) still shows the crash
failed=""
for name in "${names[@]}"; do
  log="$FUZZ_BUILD/$name.log"
  # a target that crashed, leaked or timed out says so on its last line
  if [ -r "$log" ] && ! grep -q "^fuzz $name: FAILED" "$log"; then cat "$log"; else failed="$failed $name"; fi
done
for name in $failed; do
  cat "$FUZZ_BUILD/$name.log" 2>/dev/null || echo "fuzz $name: FAILED (no log)"
done
[ -z "$failed" ] || { echo "run-fuzz: failed:$failed (their logs above)"; exit 1; }
