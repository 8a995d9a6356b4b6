#!/usr/bin/env bash
# gpu-observe-check.sh: on one GPU, with a build tree made elsewhere: the 3B spec as shipped (parallel.gpus =
# "auto") starts training, its plan's memory picture, and the tiny run with its report. Logs, SVGs and the
# report under $OUT (default out/); a summary table last. Under 5 minutes on one H200.
# usage: [PARTS="auto3b svg tiny"] tools/gpu-observe-check.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
PARTS=${PARTS:-auto3b svg tiny}
. "$(dirname "$0")/check_common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
# The spec as shipped, two steps at 32K (its own 256K step takes minutes on one GPU): the start-up must say how
# many GPUs "auto" found, and the step lines must come.
want auto3b && GREP='parallel.gpus = "auto": [^(]*' run auto3b 280 "$B/cpgen" specs/llama3b.lua --seq 32K \
  --set train.steps=2 --set train.warmup=0 --set train.out_dir="$out/auto3b"
want auto3b && note "$(printf '%-12s %s' auto3b-steps "$(grep -cE '^step [0-9]+/2' "$out/auto3b.log") step lines")"
want svg && GREP='fits: [a-z]+' run svg3b 30 "$B/cpgen" plan llama3b --seq 128K --svg "$out/memory_llama3b_128K.svg"
want tiny && GREP='report: .*' run tiny 120 "$B/cpgen" run specs/tiny.lua --set train.out_dir="$out/tiny"
want tiny && GREP='report.svg: [0-9]+ steps' run report 20 "$B/cpgen" report "$out/tiny"
echo "gpu-observe-check: $(head -1 "$out/gpu.txt" 2>/dev/null)"
