#!/usr/bin/env bash
# gpu-memory-check.sh: on one GPU (or GPUS), with a build tree made elsewhere: how long a sequence fits, measured.
#   noffload  the 3B shape at the longest length the plan fits with nothing in host memory (checkpoints and
#             optimizer on the GPU), as a 2-layer model at full length keeping the full plan's choices: peak GPU
#             memory against the plan
#   overhead  the 3B shape at 128K and 256K with checkpoints on the GPU and with all of them on the host (one step
#             each): the step time offload adds
#   longest   the SPECS (default the 3B and 8B shapes) at the longest length the plan fits GPUS GPUs and HOST_MEM of
#             host memory (default 1 and 128 GiB a GPU), as LAYERS-layer models (default 2) at full length keeping
#             the full plan's choices: peak GPU and host memory against the plan, beside the full depth's plan
# usage: [PARTS="noffload overhead longest"] [GPUS=1] [HOST_MEM=128G] [SPECS="llama3b llama8b"] [LAYERS=2]
#   tools/gpu-memory-check.sh [BUILD_DIR]; logs under $OUT. On 2 H200s one step of the 3B shape's longest (2836K)
#   takes about 390 s as 1 layer, of the 8B shape's (1752K with 256 GiB) about 455 s as 2.
# Exit 0 when every run completes, 1 when one fails (or the plan fits nothing), 77 when fewer than GPUS GPUs are here
# (tools/check_common.sh).
set -u
B=${1:-build}
out=${OUT:-out}/memory-check
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
PARTS=${PARTS:-noffload overhead longest}
G=${GPUS:-1}
HOST=${HOST_MEM:-$((128 * G))G}
. "$(dirname "$0")/check_common.sh"
need_gpus "$G" "every part (GPUS=$G)" || finish
plan() { "$B/cpgen" plan "$@" --gpus "$G" --host-mem "$HOST"; }
# longest SPEC SETS...: the plan's longest sequence in tokens
longest() { plan "$@" --max-seq 2>/dev/null | sed -n 's/.*(\([0-9]*\)).*/\1/p' | head -1; }
# cpgen_run NAME TIMEOUT ARGS...: `cpgen run ARGS` on G GPUs with HOST of host memory (counted by check_common's
# run), then its done: and host memory: lines
cpgen_run() {
  local name=$1 t=$2
  shift 2
  run "$name" "$t" "$B/cpgen" run "$@" --gpus "$G" --host-mem "$HOST" --set "train.out_dir=$out/runs/$name"
  note "  $(grep -E '^done:|^host memory:' "$out/$name.log" | sed 's/^done: //' | tr '\n' ' ')"
}
# proof SPEC NAME SETS...: the plan's longest with SETS, then one step of its LAYERS-layer model at that length
proof() {
  local spec=$1 name=$2 layers=${LAYERS:-2}
  shift 2
  local n
  n=$(longest "$spec" "$@")
  [ -n "$n" ] || { fail "$name: the plan fits no length (cpgen plan $spec $* --max-seq)"; return; }
  mapfile -t keep < <(plan "$spec" --seq "$n" "$@" --json | tools/plan_sets.py "$layers")
  note "$name: the plan fits $n tokens on $G GPU(s) with $HOST of host memory; full depth: $(plan "$spec" --seq "$n" \
    "$@" | grep -E '^  peak|^predicted step' | tr -s ' ' | tr '\n' ' ')"
  note "  as $layers layer(s): ${keep[*]}"
  cpgen_run "${name}_${layers}l_$n" 590 "$spec" --seq "$n" --set train.steps=1 --set train.warmup=0 "$@" "${keep[@]}"
}
want noffload && proof llama3b l3b_noffload --set parallel.offload=none --set parallel.optimizer=gpu
if want overhead; then
  # one step each: the 256K step takes about 190 s, and pinning 42 GiB and drawing the weights another 40
  for s in 128K 256K; do
    cpgen_run "l3b_${s}_gpu" 400 llama3b --seq "$s" --set parallel.offload=none --set train.steps=1 --set train.warmup=0
    cpgen_run "l3b_${s}_host" 400 llama3b --seq "$s" --set parallel.offload=all --set train.steps=1 --set train.warmup=0
  done
fi
if want longest; then
  for spec in ${SPECS:-llama3b llama8b}; do proof "$spec" "$spec"; done
fi
echo
cat "$sum"
finish
