#!/usr/bin/env bash
# gpu-train-check.sh: on a GPU machine, with a build tree made elsewhere: the GEMM test, the tiny training test
# (copy task, variants, export for the PyTorch comparison), the comparison with transformers (UPipe stages of four
# and two heads), and a two-layer Llama-3.1-8B-shaped model at 128K tokens (progress lines, speed, measured against
# planned memory), also with its checkpoints offloaded to the host.
# Logs under $OUT (default out/); a summary at the end. Exit 0 when every test and run passes, 1 when one fails, 77
# when one was skipped (tools/check_common.sh).
# usage: [PARTS="gemm tiny hf hf2 l8b l8b_off"] tools/gpu-train-check.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
PARTS=${PARTS:-gemm tiny hf hf2 l8b l8b_off}
. "$(dirname "$0")/check_common.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
want gemm && run test_gemm 45 "$B/tests/gpu/test_gemm"
export CPGEN_HF_DIR=/tmp/cpgen-hf
want tiny && run test_train_tiny 300 "$B/tests/gpu/test_train_tiny"
cp /tmp/cpgen-hf/metrics.jsonl "$out/hf_metrics.jsonl" 2>/dev/null
want hf && run hf_compare 60 python3 tests/gpu/hf_compare.py /tmp/cpgen-hf
# the same comparison with two query heads per UPipe stage (2 stages, K and V fresh in each, dK/dV in bf16)
want hf2 && CPGEN_HF_DIR=/tmp/cpgen-hf2 CPGEN_HF_ONLY=1 CPGEN_HF_STEPS=10 CPGEN_HF_SETS=parallel.upipe_heads=2 \
  run hf2_export 40 "$B/tests/gpu/test_train_tiny"
want hf2 && run hf2_compare 60 python3 tests/gpu/hf_compare.py /tmp/cpgen-hf2
L8="--gpus 1 --set model.layers=2 --set model.vocab=32768 --seq 128K"
want l8b && run l8b_128k 50 "$B/cpgen" run llama8b $L8 --set train.steps=3 --set "train.out_dir=$out/runs/l8b"
want l8b_off && run l8b_offload 40 "$B/cpgen" run llama8b $L8 --set train.steps=2 --set parallel.offload=all \
  --set "train.out_dir=$out/runs/l8b_off"
echo
echo "== gpu: $(cat "$out/gpu.txt")"
[ -f "$out/test_gemm.log" ] && echo "== test_gemm" && grep -E "comparisons|FAIL|PASSED|FAILED" "$out/test_gemm.log" | tail -4
[ -f "$out/test_train_tiny.log" ] && echo "== test_train_tiny" && grep -E "^copy task|^loss curve|^speed|^memory|^variant|PASSED|FAILED|ERROR|error" \
  "$out/test_train_tiny.log" | head -20
[ -f "$out/hf_compare.log" ] && echo "== hf_compare" && grep -v "Loading weights" "$out/hf_compare.log" | tail -45
[ -f "$out/hf2_compare.log" ] && echo "== hf2_compare (upipe_heads=2)" && grep -E "err|global|^step 1:" "$out/hf2_compare.log" | tail -25
for n in l8b_128k l8b_offload; do
  [ -f "$out/$n.log" ] || continue
  echo "== $n"; grep -E "^(device|host|executor|kernels|weights|done)|^step|^  step|cpgen:" "$out/$n.log" | tail -9
done
echo "== summary"; cat "$sum"
finish
