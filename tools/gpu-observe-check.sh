#!/usr/bin/env bash
# gpu-observe-check.sh: on one GPU, with a build tree made elsewhere: the 3B spec as shipped (parallel.gpus =
# "auto") starts training, its plan's memory picture, the tiny run with its report, and the step trace of a 3B step
# at 32K (checked with tools/trace_check.py against the step line's time, its first layer drawn with matplotlib).
# Logs, SVGs, the trace and its picture under $OUT (default out/); a summary table last. Under 8 minutes on one H200.
# Exit 0 when every run and check passes, 1 when one fails, 77 when one was skipped (tools/check_common.sh).
# usage: [PARTS="auto3b svg tiny trace3b"] tools/gpu-observe-check.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
PARTS=${PARTS:-auto3b svg tiny trace3b}
. "$(dirname "$0")/check_common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
# The spec as shipped, two steps at 32K (its own 256K step takes minutes on one GPU): the start-up must say how
# many GPUs "auto" found, and the step lines must come.
want auto3b && GREP='parallel.gpus = "auto": [^(]*' run auto3b 280 "$B/cpgen" specs/llama3b.lua --seq 32K \
  --set train.steps=2 --set train.warmup=0 --set train.out_dir="$out/auto3b"
if want auto3b; then
  note "$(printf '%-12s %s' auto3b-steps "$(grep -cE '^step [0-9]+/2' "$out/auto3b.log") step lines")"
  expect auto3b 'parallel\.gpus = "auto": ' 'the start-up does not say how many GPUs "auto" found'
  expect auto3b '^step 2/2' 'no line of step 2/2'
fi
if want svg; then
  GREP='fits: [a-z]+' run svg3b 30 "$B/cpgen" plan llama3b --seq 128K --svg "$out/memory_llama3b_128K.svg"
  if [ -s "$out/memory_llama3b_128K.svg" ]; then pass; else fail "svg3b: no $out/memory_llama3b_128K.svg"; fi
fi
if want tiny; then
  GREP='report: .*' run tiny 120 "$B/cpgen" run specs/tiny.lua --set train.out_dir="$out/tiny"
  GREP='report.svg: [0-9]+ steps' run report 20 "$B/cpgen" report "$out/tiny"
  expect report 'report\.svg: [1-9][0-9]* steps' 'the report drew no steps'
fi
# The step trace: the second of two 3B steps at 32K. The checker takes the step's time from metrics.jsonl (the step
# line's number, unrounded); the picture is layer 0's forward, measured above predicted.
want trace3b && GREP='trace: [^ ]+' run trace3b 300 "$B/cpgen" run llama3b --gpus 1 --seq 32K --set train.steps=2 \
  --set train.out_dir="$out/trace3b" --trace "$out/trace.json"
if want trace3b; then
  secs=$(python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][1]["seconds"])' \
    "$out/trace3b/metrics.jsonl" 2>/dev/null)
  # without the step's own time the checker would test less than it says
  [ -n "$secs" ] || fail "trace3b: $out/trace3b/metrics.jsonl has no second step to time the trace against"
  run trace_check 120 python3 tools/trace_check.py "$out/trace.json" ${secs:+--step-seconds "$secs"}
  note "  $(tail -1 "$out/trace_check.log")"
  run trace_plot 120 python3 tools/trace_plot.py "$out/trace.json" "$out/trace_layer0.png" --layer 0
  note "  $(tail -1 "$out/trace_plot.log")"
fi
echo "gpu-observe-check: $(head -1 "$out/gpu.txt" 2>/dev/null)"
finish
