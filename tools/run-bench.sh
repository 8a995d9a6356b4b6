#!/usr/bin/env bash
# run-bench.sh: run each benchmark binary (each runs its PyTorch peer itself, in the same call), counted as
# tools/run-tests.sh counts tests: passed, failed and skipped (exit 77: no GPU here), with the same exit status.
# usage: tools/run-bench.sh BENCH...
set -u
exec "$(dirname "$0")/run-tests.sh" "$@"
