#!/usr/bin/env bash
# sweep.sh: tune the Llama-3.2-3B shape at 128K tokens on this machine within a budget, then train the tuned spec
# for two steps and set its measured step beside the tune's prediction. Without a GPU the tune ranks by the plan and
# the run prints the tuned plan. Output in $OUT: the table (tune.txt), tune.jsonl, tune.svg, tuned.lua, run.log.
# usage: [BUDGET=8m] [SEQ=128K] [OUT=runs/sweep_3b] examples/sweep.sh [BUILD_DIR]
set -euo pipefail
B=${1:-build}
BUDGET=${BUDGET:-8m}
SEQ=${SEQ:-128K}
OUT=${OUT:-runs/sweep_3b}
mkdir -p "$OUT"

echo "== tune llama3b at $SEQ, budget $BUDGET"
"$B/cpgen" tune llama3b --seq "$SEQ" --budget "$BUDGET" -o "$OUT" | tee "$OUT/tune.txt"

echo "== 2 steps of the tuned spec"
"$B/cpgen" run "$OUT/tuned.lua" --set train.steps=2 --set train.warmup=0 --set train.out_dir="$OUT/run" | tee "$OUT/run.log"
grep "^winner" -A1 "$OUT/tune.txt"
grep "^step " "$OUT/run.log" || echo "(no GPU: nothing trained; the tuned plan is above)"
