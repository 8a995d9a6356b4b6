#!/usr/bin/env bash
# run-tests.sh: run each test binary, show its output, and end with one "N passed, N failed" line.
set -u
passed=0; failed=0; failed_names=()
for t in "$@"; do
  echo "== $t"
  if "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names+=("$t"); fi
done
echo
[ $failed -eq 0 ] || echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
