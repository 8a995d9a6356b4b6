#!/usr/bin/env bash
# gpu-attention-profile.sh: Nsight Compute on one launch of the attention backward, then in a second run of the
# forward, that the runtime runs (on Hopper the wgmma kernels of templates/attention_bwd_sm90.cuh and
# attention_sm90.cuh, elsewhere the mma.sync ones of templates/attention.cu), through
# `bench_attention --only bwd|fwd --reps 1` at head_dim HEAD_DIM (default 128), SHAPE query/KV heads (default 32/8)
# and SEQ tokens (default 32768), causal.
# ncu runs with --clock-control none (the clocks a training run sees, not locked to base), --kernel-name matching
# that direction's kernel alone (not the dQ conversion, attention_bwd_dq_*), --launch-skip 2 (bench_attention's two
# warm-up runs; the count is of matching launches only) --launch-count 1, the sections SpeedOfLight,
# ComputeWorkloadAnalysis, MemoryWorkloadAnalysis, Occupancy, LaunchStats, WarpStateStats and SchedulerStats, and the
# tensor pipe metrics of METRICS (default: the wgmma and mma.sync pipes' cycles) that `ncu --query-metrics` lists on
# this GPU (a name it does not know would fail the run).
# Under LOGDIR (default BUILD_DIR/attn-profile), for DIR fwd and bwd: DIR.ncu-rep (for ncu-ui), DIR.log (ncu's run),
# DIR_details.log (the whole report, --print-details all), DIR_raw.csv (every metric collected, --csv --page raw),
# and summary.txt and table.txt.
# Last a table (tools/ncu_summary.py): duration, TF/s from it (forward 4 S^2 QH D / 2, backward 2.5 times that), SM
# throughput, tensor pipe use, registers per thread, achieved occupancy, shared memory per block and the top three
# warp stall reasons.
# ncu: NCU if set, else ncu on PATH, else the newest /opt/nvidia/nsight-compute/*/ncu, else /usr/local/cuda/bin/ncu.
# Reading the GPU's counters may need root or the driver's NVreg_RestrictProfilingPermission=0 (ERR_NVGPUCTRPERM).
# Build first: make build/tests/gpu/bench_attention.
# Exit 0 when both profiles and the table came out, 1 when a run failed or left no report, 77 without a GPU or
# without ncu (tools/check_common.sh).
# usage: [SEQ=32768] [SHAPE=32/8] [HEAD_DIM=128] [LOGDIR=...] [METRICS=a,b] tools/gpu-attention-profile.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${LOGDIR:-$B/attn-profile}
mkdir -p "$out"
. "$(dirname "$0")/check_common.sh"
SEQ=${SEQ:-32768}
SHAPE=${SHAPE:-32/8}
HEAD_DIM=${HEAD_DIM:-128}
pct=avg.pct_of_peak_sustained_active
METRICS=${METRICS-sm__pipe_tensor_op_gmma_cycles_active.$pct,sm__pipe_tensor_op_hmma_cycles_active.$pct}
bench=$B/tests/gpu/bench_attention

find_ncu() {
  if [ -n "${NCU:-}" ]; then
    [ -x "$NCU" ] && echo "$NCU"
    return
  fi
  command -v ncu 2>/dev/null && return
  local c
  for c in $(printf '%s\n' /opt/nvidia/nsight-compute/*/ncu | sort -rV) /usr/local/cuda/bin/ncu; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
}
ncu=$(find_ncu)
if [ -z "$ncu" ]; then
  skip "no ncu (${NCU:+NCU=$NCU is not executable; }none on PATH, in /opt/nvidia/nsight-compute or /usr/local/cuda/bin)"
  finish
fi
if ! [[ $SHAPE =~ ^[0-9]+/[0-9]+$ && $SEQ =~ ^[0-9]+$ && $HEAD_DIM =~ ^[0-9]+$ ]]; then
  fail "SHAPE=$SHAPE SEQ=$SEQ HEAD_DIM=$HEAD_DIM: want QH/KVH and whole numbers"
  finish
fi
if [ ! -x "$bench" ]; then
  fail "no $bench: make $bench first"
  finish
fi
note "$("$ncu" --version 2>&1 | tail -1) at $ncu"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

# the extra metrics this ncu knows on this GPU: --query-metrics lists base names (up to the first '.')
"$ncu" --query-metrics >"$out/query_metrics.txt" 2>&1
extra=()
IFS=, read -r -a wanted <<<"$METRICS"
for m in ${wanted[@]+"${wanted[@]}"}; do
  if grep -q "^${m%%.*}[[:space:]]" "$out/query_metrics.txt"; then
    extra+=("$m")
  else
    note "not asked for: $m (ncu --query-metrics does not list it)"
  fi
done
metric_args=()
[ ${#extra[@]} -eq 0 ] || metric_args=(--metrics "$(IFS=,; echo "${extra[*]}")")
sections=()
for s in SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis Occupancy LaunchStats WarpStateStats \
  SchedulerStats; do sections+=(--section "$s"); done

tables=()
for dir in bwd fwd; do
  rm -f "$out/$dir.ncu-rep" "$out/${dir}_raw.csv"
  # attention_bwd_sm90_d128_... or attention_bwd_d128_... (not attention_bwd_dq_d128_...)
  kernel="regex:^attention_${dir}_(sm90_)?d[0-9]"
  run "$dir" 1800 "$ncu" --clock-control none --kernel-name "$kernel" --launch-skip 2 --launch-count 1 \
    "${sections[@]}" ${metric_args[@]+"${metric_args[@]}"} -f -o "$out/$dir" \
    "$bench" --seq "$SEQ" --head-dim "$HEAD_DIM" --shapes "$SHAPE" --only "$dir" --reps 1
  # ncu can end 0 when it profiled nothing or could not read the counters: its own lines say so
  if grep -qE "==ERROR==|No kernels were profiled" "$out/$dir.log"; then
    fail "$dir: $(grep -m1 -E "==ERROR==|No kernels were profiled" "$out/$dir.log") (log: $out/$dir.log)"
  fi
  if [ ! -s "$out/$dir.ncu-rep" ]; then
    fail "$dir: no report $out/$dir.ncu-rep (no launch matched $kernel?)"
    continue
  fi
  run "${dir}_details" 600 "$ncu" --import "$out/$dir.ncu-rep" --print-details all
  run "${dir}_raw_export" 600 bash -c '"$0" --import "$1" --csv --page raw --print-units base >"$2"' \
    "$ncu" "$out/$dir.ncu-rep" "$out/${dir}_raw.csv"
done
for dir in fwd bwd; do tables+=("$dir=$out/${dir}_raw.csv"); done

table() {
  python3 "$(dirname "$0")/ncu_summary.py" --seq "$SEQ" --q-heads "${SHAPE%%/*}" --kv-heads "${SHAPE##*/}" \
    --head-dim "$HEAD_DIM" "${tables[@]}" | tee "$out/table.txt"
  return "${PIPESTATUS[0]}"
}
echo
# (check in this shell, not in a pipe: it counts)
check table table
finish
