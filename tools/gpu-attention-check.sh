#!/usr/bin/env bash
# gpu-attention-check.sh: on one GPU, with a build tree made elsewhere: the attention kernels against the float64
# reference (test_attention) and PyTorch SDPA in fp32 (attention_sdpa.py), then bench_attention beside SDPA's FLASH
# and CUDNN backends in the same call: causal, 32 query heads, 32/32 and 32/8 heads, at the lengths and head dims of
# BENCH (default "32768:128 32768:64 131072:128"). The bench tables are printed again last. Logs under $OUT.
# BENCH_ARGS adds options to every bench_attention run (--quick: only the kernels the runtime runs, beside CUDNN).
# Exit 0 when every test, comparison and bench passes, 1 when one fails, 77 when one was skipped
# (tools/check_common.sh).
# usage: [BENCH=...] [REPS=10] [BENCH_ARGS=--quick] tools/gpu-attention-check.sh [BUILD_DIR] [test|bench|all]
set -u
B=${1:-build}
what=${2:-all}
out=${OUT:-out}
mkdir -p "$out"
PARTS=$what
[ "$what" = all ] && PARTS="test bench"
. "$(dirname "$0")/check_common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
if want test; then
  SHOW=1 run test_attention 3600 "$B/tests/gpu/test_attention"
  SHOW=1 run sdpa 1200 python3 tests/gpu/attention_sdpa.py --bin "$B/tests/gpu/test_attention"
fi
if want bench; then
  : >"$out/bench_tables.txt"
  for sd in ${BENCH:-32768:128 32768:64 131072:128}; do
    S=${sd%%:*} D=${sd##*:}
    run "bench_${S}_d$D" 3600 "$B/tests/gpu/bench_attention" --seq "$S" --head-dim "$D" --reps "${REPS:-10}" \
      ${BENCH_ARGS:-}
    sed -n '/^causal attention/,$p' "$out/bench_${S}_d$D.log" >>"$out/bench_tables.txt"
  done
  echo; cat "$out/bench_tables.txt"
fi
want test && grep -E "PASSED|FAILED|^\[  FAILED" "$out/test_attention.log" | tail -5
finish
