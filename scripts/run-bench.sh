#!/usr/bin/env bash
# Run each benchmark program given, in order. Each prints its own figures
# and the baseline it measured in the same run.
set -eu
for b in "$@"; do
  echo "== $(basename "$b")"
  "$b"
done
