#!/usr/bin/env bash
# eight_gpus.sh: the headline run, Llama-3.1-8B with UPipe on one node of 8 GPUs (GPUS=8), or the same per-GPU share
# of tokens on fewer (GPUS=2: a quarter of each length). With a build tree made elsewhere; logs under $OUT.
#   1. tokens/s per GPU at 128K, 512K and 1M tokens (x GPUS/8), full depth, 3 steps each, beside the published
#      UPipe figures on 8xH100 (2,281, 867 and 473 tokens/s per GPU);
#   2. the longest length the plan fits the node (its host memory, HOST_MEM, caps the offloaded checkpoints), proven
#      by one step of a 2-layer model at that length (measured peak GPU and host memory against its plan) and the
#      plan's arithmetic for 32 layers;
#   3. the 32-layer step at 1M tokens (x GPUS/8): measured peak per GPU and the share of the step in communication
#      the plan finds not hidden behind compute;
#   and `cpgen plan` for 8 GPUs at each length, whatever GPUS is.
# usage: [GPUS=8] [HOST_MEM=560G] examples/eight_gpus.sh [BUILD_DIR]   (HOST_MEM: the node's host memory)
set -u
B=${1:-build}
G=${GPUS:-8}
HOST=${HOST_MEM:-$((G == 8 ? 560 : 128 * G))G} # the lent machines: 128 GiB per GPU up to 4, 560 GiB with 8
out=${OUT:-out}/eight_gpus
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
sum="$out/summary.txt"
: >"$sum"
note() { echo "$*" | tee -a "$sum"; }
tokens() { echo $(($1 * G / 8)); } # the same tokens per GPU as on 8 GPUs
run() { # name timeout args...
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout "$t" "$B/cpgen" run llama8b --gpus "$G" --host-mem "$HOST" --set "train.out_dir=$out/runs/$name" "$@" \
    >"$out/$name.log" 2>&1
  note "$(printf '%-18s rc=%-3d %5d s  ' "$name" "$?" $(($(date +%s) - t0)))$(grep -E '^done:' "$out/$name.log" |
    sed 's/^done: //')"
}
note "== plans for 8 GPUs"
for s in 131072 524288 1048576; do
  "$B/cpgen" plan llama8b --gpus 8 --host-mem 560G --seq "$s" >"$out/plan8_$s.txt" 2>&1
  note "  $s tokens: $(grep -E '^  peak' "$out/plan8_$s.txt" | tr -s ' ') | $(grep -E '^predicted (step|rate)' \
    "$out/plan8_$s.txt" | tr '\n' ' ')"
done
"$B/cpgen" plan llama8b --gpus 8 --host-mem 560G --max-seq >"$out/plan8_max.txt" 2>&1
note "  $(head -1 "$out/plan8_max.txt")"
note "== $G GPUs: speed (published UPipe on 8xH100: 2,281 / 867 / 473 tokens/s per GPU)"
for s in 131072 524288 1048576; do
  n=$(tokens "$s")
  run "speed_$n" 590 --seq "$n" --set train.steps=3 --set train.warmup=1
done
note "== $G GPUs: the longest length"
max=$("$B/cpgen" plan llama8b --gpus "$G" --host-mem "$HOST" --max-seq 2>/dev/null | sed -n 's/.*(\([0-9]*\)).*/\1/p' | head -1)
note "  the plan fits $max tokens on $G GPUs; 32 layers: $("$B/cpgen" plan llama8b --gpus "$G" --host-mem "$HOST" \
  --seq "$max" | grep -E '^  peak|^predicted step' | tr -s ' ' | tr '\n' ' ')"
[ -n "$max" ] && run "longest_2l_$max" 590 --seq "$max" --set model.layers=2 --set train.steps=1 --set train.warmup=0
note "== $G GPUs: 32 layers at $(tokens 1048576) tokens, memory and communication"
"$B/cpgen" plan llama8b --gpus "$G" --host-mem "$HOST" --seq "$(tokens 1048576)" | grep -E '^predicted step' |
  sed 's/^/  plan: /' | tee -a "$sum"
grep -E '^step' "$out/speed_$(tokens 1048576).log" 2>/dev/null | tail -1 | sed 's/^/  measured: /' | tee -a "$sum"
echo
cat "$sum"
