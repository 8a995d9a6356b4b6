#!/usr/bin/env bash
# eight_gpus.sh: the headline run, Llama-3.1-8B with UPipe on one node of 8 GPUs (GPUS=8), or the same lengths on
# fewer (GPUS=2). With a build tree made elsewhere; logs under $OUT.
# Parts (PARTS, default all; each runs within 10 minutes on 8 GPUs except where said):
#   plans    `cpgen plan` for 8 GPUs at 128K, 512K and 1M tokens and the longest that fits, whatever GPUS is;
#   speed    tokens/s per GPU at the total lengths SEQS (default 128K 512K 1M on 8 GPUs, 128K 256K on fewer, whose
#            steps take 8/GPUS times as long), full depth, beside the published UPipe figures on 8xH100 (2,281, 867
#            and 473 tokens/s per GPU at 128K, 512K, 1M). With Ulysses each GPU computes attention for H/C heads over
#            all S tokens and owns S/C of them, so attention work per token goes as S x H whatever the GPU count:
#            compare rates at the same total length, never at the 8-GPU run's tokens per GPU (a shorter sequence, an
#            easier problem); 3 steps where the plan predicts under 100 s, else one (1M on 8 GPUs: about 560 s);
#   longest  the longest length the plan fits the node (its host memory, HOST_MEM, counts every rank's pinned arena
#            and loading weights), proven by one step of a 2-layer model at that length keeping the full plan's
#            choices (measured peak GPU and host memory against its plan), and the plan's arithmetic for 32 layers;
#   comm     the 32-layer step at 1M tokens (x GPUS/8) with and without its collectives (CPGEN_BENCH_SKIP_COMM=1):
#            the share of the step in communication not hidden behind compute, and the measured peak per GPU
#            (two steps of about 560 s: run it on its own).
# Exit 0 when every run passes, 1 when one fails, 77 when fewer than GPUS GPUs are here (tools/check_common.sh).
# usage: [GPUS=8] [HOST_MEM=560G] [PARTS="plans speed longest comm"] [SEQS="131072 ..."] examples/eight_gpus.sh [BUILD_DIR]
set -u
B=${1:-build}
G=${GPUS:-8}
HOST=${HOST_MEM:-$((G == 8 ? 560 : 128 * G))G} # the lent machines: 128 GiB per GPU up to 4, 560 GiB with 8
PARTS=${PARTS:-plans speed longest comm}
SEQS=${SEQS:-$( ((G == 8)) && echo 131072 524288 1048576 || echo 131072 262144)}
out=${OUT:-out}/eight_gpus
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
. "$(dirname "$0")/../tools/check_common.sh"
need_gpus "$G" "every part (GPUS=$G)" || finish
tokens() { echo $(($1 * G / 8)); } # the 8-GPU run's tokens per GPU: for the communication share, not for rates
plan() { "$B/cpgen" plan llama8b --gpus "$G" --host-mem "$HOST" "$@"; }
# cpgen_run NAME TIMEOUT ARGS...: `cpgen run llama8b ARGS` on the node (counted by check_common's run), then its done:
# and host memory: lines
cpgen_run() {
  local name=$1 t=$2
  shift 2
  run "$name" "$t" "$B/cpgen" run llama8b --gpus "$G" --host-mem "$HOST" --set "train.out_dir=$out/runs/$name" "$@"
  note "  $(grep -E '^done:|^host memory:' "$out/$name.log" | sed 's/^done: //' | tr '\n' ' ')"
}
if want plans; then
  note "== plans for 8 GPUs"
  for s in 131072 524288 1048576; do
    run "plan8_$s" 120 "$B/cpgen" plan llama8b --gpus 8 --host-mem 560G --seq "$s"
    note "  $s tokens: $(grep -E '^  peak' "$out/plan8_$s.log" | head -1 | tr -s ' ') | $(grep -E \
      '^predicted (step|rate)' "$out/plan8_$s.log" | tr '\n' ' ')"
  done
  run plan8_max 300 "$B/cpgen" plan llama8b --gpus 8 --host-mem 560G --max-seq
  note "  $(head -1 "$out/plan8_max.log")"
fi
if want speed; then
  note "== $G GPUs: speed at the same total lengths (published UPipe on 8xH100: 2,281 / 867 / 473 tokens/s per GPU at 128K / 512K / 1M)"
  for s in $SEQS; do
    t=$(plan --seq "$s" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["time"]["step"])')
    [ -n "$t" ] || { fail "speed_$s: no predicted step from cpgen plan --seq $s"; continue; }
    steps=$(python3 -c "print(3 if $t < 100 else 1)")
    cpgen_run "speed_$s" 590 --seq "$s" --set train.steps="$steps" --set train.warmup=$((steps > 1))
  done
fi
if want longest; then
  note "== $G GPUs: the longest"
  OUT=$out GPUS=$G HOST_MEM=$HOST SPECS=llama8b LAYERS=2 PARTS=longest run longest 1200 tools/gpu-memory-check.sh \
    "$B"
  tee -a "$sum" <"$out/memory-check/summary.txt"
fi
if want comm; then
  n=$(tokens 1048576)
  note "== $G GPUs: 32 layers at $n tokens, memory and communication; plan: $(plan --seq "$n" |
    grep -E '^predicted step')"
  for skip in 0 1; do
    CPGEN_BENCH_SKIP_COMM=$skip cpgen_run "comm_${n}_$skip" 590 --seq "$n" --set train.steps=1 --set train.warmup=0
  done
  # figures, no bound; it fails where a run left no step to read
  check comm python3 - "$out/runs/comm_${n}_0/metrics.jsonl" "$out/runs/comm_${n}_1/metrics.jsonl" <<'PY'
import json, sys
t = [json.loads(open(f).readline())["seconds"] for f in sys.argv[1:3]]
print(f"  step {t[0]:.1f} s with communication, {t[1]:.1f} s without: {t[0] - t[1]:.1f} s "
      f"({100 * (t[0] - t[1]) / t[0]:.1f}%) not hidden behind compute")
PY
fi
echo
cat "$sum"
finish
