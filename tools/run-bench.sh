#!/usr/bin/env bash
# run-bench.sh: run each benchmark binary, then the PyTorch peers beside them (same machine, same call).
set -u
rc=0
for b in "$@"; do
  echo "== $b"
  "$b" || rc=1
done
for p in tests/gpu/bench_*.py; do
  [ -f "$p" ] || continue
  echo "== $p"
  python3 "$p" || rc=1
done
exit $rc
