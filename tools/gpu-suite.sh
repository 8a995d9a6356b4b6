#!/usr/bin/env bash
# gpu-suite.sh: on a GPU machine, with a build tree made elsewhere (the GPU machine may have no Lua or cmocka):
# the GPU tests, then the benchmarks beside their PyTorch peers. Logs go under $OUT (default out/).
# Exit 0 when every test and benchmark passes, 1 when one fails, 77 when one was skipped (a test this machine cannot
# run: too few GPUs, another architecture; tools/check_common.sh).
# usage: tools/gpu-suite.sh [BUILD_DIR] [tests|bench|all]
set -u
B=${1:-build}
what=${2:-all}
out=${OUT:-out}
mkdir -p "$out"
PARTS=$what
[ "$what" = all ] && PARTS="tests bench"
. "$(dirname "$0")/check_common.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
if want tests; then
  # a build tree without the tests finds none, and run-tests.sh fails a call with no test
  SHOW=1 run tests 7200 tools/run-tests.sh $(find "$B/tests/gpu" -name 'test_*' -type f -executable | sort)
  SHOW=1 run sdpa 1200 python3 tests/gpu/attention_sdpa.py --bin "$B/tests/gpu/test_attention"
fi
if want bench; then
  SHOW=1 run bench 7200 tools/run-bench.sh $(find "$B/tests/gpu" -name 'bench_*' -type f -executable | sort)
fi
finish
