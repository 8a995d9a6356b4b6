#!/usr/bin/env bash
# bench-train.sh: one-GPU training beside its peer, in one call on a GPU machine with a build tree made elsewhere:
# cpgen and transformers (tests/gpu/bench_train_peer.py) on the same shape at the same lengths; then cpgen's
# memory against its plan at longer lengths, and the longest length whose plan fits without offload.
# Exit 0 when every run completes, 1 when one fails, 77 without a GPU (tools/check_common.sh).
# usage: [SPEC=llama3b] [SEQS="16384 32768 65536"] [MEM_SEQS="16384 65536 131072"] tools/bench-train.sh [BUILD_DIR]
set -u
B=${1:-build}
SPEC=${SPEC:-llama3b}
SEQS=${SEQS:-16384 32768 65536}
MEM_SEQS=${MEM_SEQS:-16384 65536 131072}
out=${OUT:-out}
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
. "$(dirname "$0")/check_common.sh"
# the peer needs the plan's shape: without it nothing here can be compared
if "$B/cpgen" plan "$SPEC" --gpus 1 --json >"$out/plan.json" 2>"$out/plan.err"; then
  pass
else
  fail "cpgen plan $SPEC: $(tail -1 "$out/plan.err")"
  finish
fi
for s in $SEQS; do
  run "cpgen_$s" 900 "$B/cpgen" run "$SPEC" --gpus 1 --seq "$s" --set train.steps=4 --set train.warmup=1 \
    --set "train.out_dir=$out/runs/${SPEC}_$s"
  note "cpgen seq $s: $(grep '^done:' "$out/cpgen_$s.log" || tail -1 "$out/cpgen_$s.log")"
done
check peer python3 tests/gpu/bench_train_peer.py --plan-json "$out/plan.json" --seq "$(echo $SEQS | tr ' ' ,)" \
  2>"$out/peer.err"
for s in $MEM_SEQS; do
  run "mem_$s" 900 "$B/cpgen" run "$SPEC" --gpus 1 --seq "$s" --set train.steps=2 --set train.warmup=1 \
    --set "train.out_dir=$out/runs/${SPEC}_mem_$s"
  note "memory seq $s: $(grep '^done:' "$out/mem_$s.log" | sed 's/.*peak memory/peak memory/' ||
    tail -1 "$out/mem_$s.log")"
done
run longest 120 "$B/cpgen" plan "$SPEC" --gpus 1 --set parallel.offload=none --max-seq
note "$(head -1 "$out/longest.log")"
echo
cat "$sum"
finish
