#!/usr/bin/env bash
# Run every test binary under $BUILD/tests and every tests/*_test.py, then
# print one closing line "N passed, N failed" (counted in test cases).
# Tests read ../shared/models in place (TP_MODELS overrides) and find the
# programs under $BIN.
set -u
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
export TP_BIN_DIR=$(cd "$BIN" && pwd)
export TP_MODELS=${TP_MODELS:-$(cd ../shared/models 2>/dev/null && pwd)}
if [ ! -r "$TP_MODELS/stories260K.bin" ]; then
  echo "run-tests: models not found in '${TP_MODELS:-../shared/models}': set TP_MODELS to shared/models" >&2
  exit 2
fi
export TP_BUILD_DIR=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3   # Debian's python, where python3-zmq/msgpack live
# A hung test is a failure with its name, not a CI run that never ends
# (the slowest binary takes well under a minute, ASan included).
LIMIT=${TP_TEST_TIMEOUT:-300}

passed=0; failed=0; failed_names=()
log=$(mktemp)

times=$(mktemp); trap 'rm -f "$log" "$times"' EXIT
started=$SECONDS
count() {   # $1 = name, $2 = exit code; reads cmocka/unittest summaries in $log
  local p f
  echo "$((SECONDS - started)) $1" >>"$times"; started=$SECONDS
  p=$(grep -oE '\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
  f=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$4} END {print s+0}')
  if grep -qE '^Ran [0-9]+ test' "$log"; then
    local ran; ran=$(grep -oE '^Ran [0-9]+' "$log" | awk '{print $2}')
    f=$(grep -oE 'FAILED \((failures|errors)=[0-9]+(, (failures|errors)=[0-9]+)?' "$log" \
        | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
    p=$((ran - f))
  fi
  if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or aborted early
  passed=$((passed + p)); failed=$((failed + f))
  [ "$f" -gt 0 ] && failed_names+=("$1")
}

for t in "$BUILD"/tests/*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  echo "== $name"; started=$SECONDS
  timeout -k 10 "$LIMIT" "$t" >"$log" 2>&1; rc=$?
  [ "$rc" -eq 124 ] && echo "run-tests: $name did not finish in ${LIMIT}s" >>"$log"
  cat "$log"
  count "$name" "$rc"
done

# On a CPU with AVX-512 the kernels take its paths, so the AVX2 kernels
# (what a CPU without it runs) would go unchecked by the tests that compare
# the CPU's paths with the portable one: run those again capped at AVX2
# (isa.h). test_forward and test_quant cap each level themselves.
if grep -qw avx512bw /proc/cpuinfo 2>/dev/null; then
  for name in test_prefix test_logprobs test_arch it_quant; do
    t="$BUILD/tests/$name"
    [ -x "$t" ] || continue
    echo "== $name (TP_ISA=avx2)"; started=$SECONDS
    TP_ISA=avx2 timeout -k 10 "$LIMIT" "$t" >"$log" 2>&1; rc=$?
    [ "$rc" -eq 124 ] && echo "run-tests: $name did not finish in ${LIMIT}s" >>"$log"
    cat "$log"
    count "$name (TP_ISA=avx2)" "$rc"
  done
fi

for t in tests/*_test.py; do
  [ -e "$t" ] || continue
  echo "== $t"; started=$SECONDS
  timeout -k 10 "$LIMIT" "$PY" -m unittest -v "$t" >"$log" 2>&1; rc=$?
  [ "$rc" -eq 124 ] && echo "run-tests: $t did not finish in ${LIMIT}s" >>"$log"
  cat "$log"
  count "$t" "$rc"
done

# where the time went (CI has a budget): the slowest ten
echo "slowest (s):" $(sort -rn "$times" | head -n 10 | awk '{printf "%s %s;", $2, $1}')
[ ${#failed_names[@]} -gt 0 ] && echo "failing: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
