#!/usr/bin/env bash
# gpu-train-check.sh: on a GPU machine, with a build tree made elsewhere: the GEMM test, the tiny training test
# (recall task, variants, export for the PyTorch comparison), the comparison with transformers, a long tiny run, and
# a two-layer Llama-3.1-8B-shaped model at 128K tokens (progress lines, speed, measured against planned memory),
# with its checkpoints offloaded to the host. Logs under $OUT (default out/); a summary at the end.
# usage: tools/gpu-train-check.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
sum="$out/summary.txt"
: >"$sum"
note() { echo "$*" | tee -a "$sum"; }
run() { # name timeout command...
  local name=$1 t=$2; shift 2
  local t0=$(date +%s%N)
  timeout "$t" "$@" >"$out/$name.log" 2>&1
  local rc=$? t1=$(date +%s%N)
  note "$(printf '%-16s rc=%-3d %6d ms' "$name" "$rc" $(((t1 - t0) / 1000000)))"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
run test_gemm 45 "$B/tests/gpu/test_gemm"
export CPGEN_HF_DIR=/tmp/cpgen-hf
run test_train_tiny 60 "$B/tests/gpu/test_train_tiny"
cp /tmp/cpgen-hf/metrics.jsonl "$out/hf_metrics.jsonl" 2>/dev/null
run hf_compare 60 python3 tests/gpu/hf_compare.py /tmp/cpgen-hf
run tiny1000 25 "$B/cpgen" run tiny --set train.steps=1000 --set train.warmup=50 --set train.log_every=50 \
  --set "train.out_dir=$out/runs/tiny1000"
L8="--gpus 1 --set model.layers=2 --set model.vocab=32768 --seq 128K"
run l8b_128k 50 "$B/cpgen" run llama8b $L8 --set train.steps=3 --set "train.out_dir=$out/runs/l8b"
run l8b_offload 40 "$B/cpgen" run llama8b $L8 --set train.steps=2 --set parallel.offload=all \
  --set "train.out_dir=$out/runs/l8b_off"
echo
echo "== gpu: $(cat "$out/gpu.txt")"
echo "== test_gemm"; grep -E "comparisons|FAIL|PASSED|FAILED" "$out/test_gemm.log" | tail -4
echo "== test_train_tiny"; grep -E "^recall|^loss curve|^speed|^memory|^variant|PASSED|FAILED|ERROR|error" \
  "$out/test_train_tiny.log" | head -20
echo "== hf_compare"; tail -4 "$out/hf_compare.log"
for n in tiny1000 l8b_128k l8b_offload; do
  echo "== $n"; grep -E "^(device|host|executor|kernels|weights|done)|^step|^  step|cpgen:" "$out/$n.log" | tail -9
done
echo "== summary"; cat "$sum"
