#!/usr/bin/env bash
# Run each benchmark program given, in order. Each prints its own figures
# and the baseline it measured in the same run.
set -eu
for b in "$@"; do
  echo "== $(basename "$b")"
  case "$b" in
    *.py) TP_BIN_DIR="${BIN:-bin}" TP_BUILD_DIR="${BUILD:-build}" /usr/bin/python3 "$b" ;;
    *) "$b" ;;
  esac
done
