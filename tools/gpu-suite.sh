#!/usr/bin/env bash
# gpu-suite.sh: on a GPU machine, with a build tree made elsewhere (the GPU machine may have no Lua or cmocka):
# the GPU tests, then the benchmarks beside their PyTorch peers. Logs go under $OUT (default out/).
# usage: tools/gpu-suite.sh [BUILD_DIR] [tests|bench|all]
set -u
B=${1:-build}
what=${2:-all}
out=${OUT:-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
rc=0
if [ "$what" != bench ]; then
  tools/run-tests.sh $(find "$B/tests/gpu" -name 'test_*' -type f -executable | sort) 2>&1 | tee "$out/tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  python3 tests/gpu/attention_sdpa.py --bin "$B/tests/gpu/test_attention" 2>&1 | tee "$out/sdpa.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "$what" != tests ]; then
  tools/run-bench.sh $(find "$B/tests/gpu" -name 'bench_*' -type f -executable | sort) 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
exit $rc
