#!/usr/bin/env bash
# gpu-memory-check.sh: on one GPU, with a build tree made elsewhere: how long a sequence fits, measured.
#   noffload  the 3B shape at the longest length the plan fits with every layer's checkpoint on the GPU (one step;
#             sparser checkpoints reach about twice as far, and a step there takes too long for one call), measured
#             peak against the plan
#   overhead  the 3B shape at 128K and 256K with checkpoints on the GPU and with all of them on the host (one step
#             each): the step time offload adds
#   longest   the 3B shape (and the 8B shape, optimizer on the host) at the longest length the plan fits with the
#             defaults, as a 2-layer model at full length: peak GPU and host memory against the plan
# usage: [PARTS="noffload overhead longest"] tools/gpu-memory-check.sh [BUILD_DIR]; logs under $OUT.
set -u
B=${1:-build}
out=${OUT:-out}/memory-check
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
PARTS=${PARTS:-noffload overhead longest}
want() { [[ " $PARTS " == *" $1 "* ]]; }
sum="$out/summary.txt"
: >"$sum"
note() { echo "$*" | tee -a "$sum"; }
# longest SPEC SETS...: the plan's longest sequence in tokens
longest() { "$B/cpgen" plan "$@" --gpus 1 --max-seq 2>/dev/null | sed -n 's/.*(\([0-9]*\)).*/\1/p' | head -1; }
run() { # name timeout args...
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout "$t" "$B/cpgen" run "$@" --gpus 1 --set "train.out_dir=$out/runs/$name" >"$out/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-22s rc=%-3d %5d s  ' "$name" "$rc" $(($(date +%s) - t0)))$(grep -E '^done:' "$out/$name.log" |
    sed 's/^done: //')"
}
if want noffload; then
  n=$(longest llama3b --set parallel.offload=none --set parallel.checkpoint_every=1)
  note "3B, every layer's checkpoint on the GPU: the plan fits $n tokens"
  [ -n "$n" ] && run "l3b_noffload_$n" 560 llama3b --seq "$n" --set parallel.offload=none \
    --set parallel.checkpoint_every=1 --set train.steps=1 --set train.warmup=0
fi
if want overhead; then
  # one step each: the 256K step takes about 190 s, and pinning 42 GiB and drawing the weights another 40
  for s in 128K 256K; do
    run "l3b_${s}_gpu" 400 llama3b --seq "$s" --set parallel.offload=none --set train.steps=1 --set train.warmup=0
    run "l3b_${s}_host" 400 llama3b --seq "$s" --set parallel.offload=all --set train.steps=1 --set train.warmup=0
  done
fi
if want longest; then
  for spec in llama3b llama8b; do
    n=$(longest "$spec")
    [ -n "$n" ] || continue
    # the full-depth plan's choices, kept for the 2-layer run
    mapfile -t keep < <("$B/cpgen" plan "$spec" --gpus 1 --seq "$n" --json | tools/plan_sets.py 2)
    note "$spec: the plan fits $n tokens on one GPU; as 2 layers: ${keep[*]}"
    run "${spec}_2l_$n" 560 "$spec" --seq "$n" --set train.steps=1 --set train.warmup=0 "${keep[@]}"
  done
fi
echo
cat "$sum"
