#!/usr/bin/env bash
# run-bench.sh: run each benchmark binary; each one runs its PyTorch peer itself, in the same call.
set -u
rc=0
for b in "$@"; do
  echo "== $b"
  "$b" || rc=1
done
exit $rc
