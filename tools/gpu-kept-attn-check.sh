#!/usr/bin/env bash
# gpu-kept-attn-check.sh: on one H200, with a build tree made elsewhere, kept attention outputs (parallel.attention_output)
# against recomputing attention in the backward:
#   numerics  tests/gpu/test_train_tiny and tests/gpu/hf_check.sh (tiny, l8b) with the outputs kept on the GPU and
#             on the host (the same bounds as every other mode);
#   speed     the 3B shape at 32K and 128K tokens, "recompute" against "auto" (which keeps every layer's output on
#             the GPU there) in the same call: step time, measured against planned memory, the plan's predicted step;
#             the 128K recompute step is profiled (CPGEN_PROFILE=2), whose attention forward time is the ceiling of the
#             saving.
# About 8 minutes. Logs under $OUT (default out/kept-attn); a table at the end. Exit 0 when every test and run passes,
# 1 when one fails, 77 when one was skipped (tools/check_common.sh).
# usage: [PARTS="tiny hf 32k 128k"] tools/gpu-kept-attn-check.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}/kept-attn
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
PARTS=${PARTS:-tiny hf 32k 128k}
. "$(dirname "$0")/check_common.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1

for m in gpu host; do
  want tiny && CPGEN_TINY_SETS="parallel.attention_output=$m" run "train_tiny_$m" 120 "$B/tests/gpu/test_train_tiny"
  want hf && HF_SETS="parallel.attention_output=$m" OUT="$out/hf_$m" run "hf_check_$m" 240 tests/gpu/hf_check.sh "$B" tiny l8b
done

# the 3B shape on one GPU: two steps each (the second is timed), recompute first
table="$out/table.txt"
printf '%-6s %-10s %-26s %10s %10s %24s\n' seq mode "attention output" "step s" "plan s" "memory meas/plan GiB" >"$table"
bench() { # seq mode steps timeout
  local s=$1 m=$2 n=$3 t=$4 name="l3b_${1}_$2" prof=
  [ "$s" = 128K ] && [ "$m" = recompute ] && prof=2
  "$B/cpgen" plan llama3b --gpus 1 --seq "$s" --set "parallel.attention_output=$m" >"$out/$name.plan.txt" 2>&1
  CPGEN_PROFILE=$prof run "$name" "$t" "$B/cpgen" run llama3b --gpus 1 --seq "$s" --set "parallel.attention_output=$m" \
    --set train.steps="$n" --set train.warmup=1 --set "train.out_dir=$out/runs/$name"
  local line kept planned secs mem
  line=$(grep -E "^step $n/$n" "$out/$name.log" | tail -1)
  kept=$(grep -oE "attention output \([a-z]+\): .*" "$out/$name.plan.txt" | sed -E 's/attention output \([a-z]+\): //; s/ for layers/:/; s/attention recomputed/recomputed/' | cut -c1-26)
  planned=$(grep -oE "^predicted step: [0-9.]+ s" "$out/$name.plan.txt" | grep -oE "[0-9.]+")
  secs=$(echo "$line" | grep -oE "\| [0-9.]+ s \|" | grep -oE "[0-9.]+")
  mem=$(echo "$line" | grep -oE "mem [0-9.]+/[0-9.]+" | sed 's/mem //')
  printf '%-6s %-10s %-26s %10s %10s %24s\n' "$s" "$m" "$kept" "${secs:-?}" "${planned:-?}" "${mem:-?}" >>"$table"
}
want 32k && for m in recompute auto; do bench 32K "$m" 3 90; done
want 128k && for m in recompute auto; do bench 128K "$m" 2 200; done

echo
echo "== gpu: $(cat "$out/gpu.txt")"
for f in "$out"/train_tiny_*.log; do
  [ -f "$f" ] && echo "== $(basename "$f" .log)" && grep -E "^copy task|^loss curve|^variant|PASSED|FAILED|ERROR" "$f" | head -8
done
for m in gpu host; do
  [ -f "$out/hf_check_$m.log" ] && echo "== hf_check, attention_output=$m" && cat "$out/hf_check_$m.log"
done
[ -f "$out/l3b_128K_recompute.log" ] && echo "== 128K recompute, profile of step 2 (attention forward = the saving's ceiling)" &&
  grep -iE "attn_fwd|attention" "$out/l3b_128K_recompute.log" | head -12
echo "== summary"; cat "$sum"
echo "== the 3B shape on one GPU (step: the last step's wall time; plan: cpgen plan's predicted step)"
cat "$table"
finish
