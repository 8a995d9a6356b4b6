#!/usr/bin/env bash
# bench-train.sh: one-GPU training beside its peer, in one call on a GPU machine with a build tree made elsewhere:
# cpgen and transformers (tests/gpu/bench_train_peer.py) on the same shape at the same lengths; then cpgen's
# memory against its plan at longer lengths, and the longest length whose plan fits without offload.
# usage: [SPEC=llama3b] [SEQS="16384 32768 65536"] [MEM_SEQS="16384 65536 131072"] tools/bench-train.sh [BUILD_DIR]
set -u
B=${1:-build}
SPEC=${SPEC:-llama3b}
SEQS=${SEQS:-16384 32768 65536}
MEM_SEQS=${MEM_SEQS:-16384 65536 131072}
out=${OUT:-out}
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
sum="$out/bench-train.txt"
: >"$sum"
"$B/cpgen" plan "$SPEC" --gpus 1 --json >"$out/plan.json" || exit 1
for s in $SEQS; do
  "$B/cpgen" run "$SPEC" --gpus 1 --seq "$s" --set train.steps=4 --set train.warmup=1 \
    --set "train.out_dir=$out/runs/${SPEC}_$s" >"$out/cpgen_$s.log" 2>&1
  echo "cpgen seq $s: $(grep '^done:' "$out/cpgen_$s.log" || tail -1 "$out/cpgen_$s.log")" | tee -a "$sum"
done
python3 tests/gpu/bench_train_peer.py --plan-json "$out/plan.json" --seq "$(echo $SEQS | tr ' ' ,)" 2>"$out/peer.err" |
  tee -a "$sum"
for s in $MEM_SEQS; do
  "$B/cpgen" run "$SPEC" --gpus 1 --seq "$s" --set train.steps=2 --set train.warmup=1 \
    --set "train.out_dir=$out/runs/${SPEC}_mem_$s" >"$out/mem_$s.log" 2>&1
  echo "memory seq $s: $(grep '^done:' "$out/mem_$s.log" | sed 's/.*peak memory/peak memory/' || tail -1 "$out/mem_$s.log")" |
    tee -a "$sum"
done
"$B/cpgen" plan "$SPEC" --gpus 1 --set parallel.offload=none --max-seq | head -1 | tee -a "$sum"
echo
cat "$sum"
