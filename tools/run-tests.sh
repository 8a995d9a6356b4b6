#!/usr/bin/env bash
# run-tests.sh: run each test binary, show its output, and end with one line "N passed, N failed, N skipped (...)".
# A test passes by exiting 0 and is skipped by exiting 77 after printing a line that holds "skipped" and why (it
# cannot run on this machine: no GPU, too few, the wrong architecture; automake's convention); any other status, or
# 77 without that line, is a failure. Exit status: 0 when every test passed, 1 when one failed, 77 when none failed
# but some were skipped: a run that left tests unrun is not a pass.
# usage: tools/run-tests.sh TEST...
set -u
if [ $# -eq 0 ]; then
  echo "run-tests.sh: no test given: nothing ran, which is no pass" # e.g. a find in a build tree without tests
  exit 1
fi
passed=0
failed=()
skipped=()
partial=() # passed, but cmocka skipped some of their cases: said, not counted against the run
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "$@"; do
  echo "== $t"
  # Through tee for the skip line: the test's stdout is then a pipe, as it is under CI, so its stderr lines may come
  # before stdout lines printed earlier. (stdbuf would keep the order, but its LD_PRELOAD breaks AddressSanitizer.)
  "$t" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  name=$(basename "$t")
  why=$(grep 'skipped' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    n=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -1)
    [ -z "$n" ] || partial+=("$name ($n)")
  elif [ "$rc" -eq 77 ] && [ -n "$why" ]; then
    skipped+=("$name: ${why#*skipped: }")
  elif [ "$rc" -eq 77 ]; then
    failed+=("$name (exit 77 without a line saying skipped)")
  else
    failed+=("$name (exit $rc)")
  fi
done
echo
[ ${#partial[@]} -eq 0 ] || echo "passed with some cases skipped: $(IFS=,; echo "${partial[*]}")"
[ ${#failed[@]} -eq 0 ] || echo "failed: ${failed[*]}"
line="$passed passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
if [ ${#skipped[@]} -gt 0 ]; then
  reasons=$(printf '%s; ' "${skipped[@]}")
  line="$line (${reasons%; })"
fi
echo "$line"
[ ${#failed[@]} -eq 0 ] || exit 1
[ ${#skipped[@]} -eq 0 ] || exit 77
exit 0
