#!/usr/bin/env bash
# gpu-docs-bench.sh: document-masked attention on one GPU, cpgen's kernels beside PyTorch FlexAttention, in one call.
# Method: a sequence of SEQ tokens (default 131072) cut into documents of LEN tokens (each of LENS, default
# "4096 8192 32768"; the last document shorter when SEQ is not a multiple), causal within each document, head_dim
# 128, 32 query heads with 32 and with 8 KV heads, bf16.
#   - cpgen: build/tests/gpu/bench_attention --seq SEQ --docs LEN --quick --no-sdpa: the document-masked forward and
#     backward the runtime runs (templates/attention.cu; the wgmma kernels on Hopper), inputs [S][H][D];
#   - the peer: tests/gpu/bench_attention_flex.py: flex_attention compiled with torch.compile, its block mask from
#     create_block_mask on the same documents (compiled), GQA through enable_gqa, inputs [1][H][S][D].
# Both time with CUDA events after two warm-up runs and take the median of REPS (default 10) runs; FlexAttention's
# backward is forward+backward minus forward (it includes its own rowsum(dO * O), which bench_attention computes
# outside its timed backward, so the peer's backward carries one extra memory-bound pass: well under 1% of it at
# these lengths). TF/s count only the scores kept, as bench_attention --docs does: kept = the sum over documents of
# L (L + 1) / 2 per head, forward 4 * kept * H * D FLOPs, backward 2.5 times that. The table gives both and the
# ratio cpgen / FlexAttention in TF/s (above 1: cpgen faster). The shipped 8B shape's per-GPU UPipe stage (8 query,
# 2 KV heads over the whole sequence) has the 32/8 row's ratio of heads and, at 128K, 1024 query tiles per head:
# the same kernels on a quarter of the work, so it is not a row of its own.
# Build first: make -j build/tests/gpu/bench_attention (or make bench). Needs python3 with torch (FlexAttention).
# Exit 0 when every run gave its times, 1 when one failed or a row is missing, 77 without a GPU
# (tools/check_common.sh). Logs and the table (table.txt) under $OUT/docs-bench (default out/).
# DOCS_PYTHON names the Python that runs the peer (default python3; tests/test_checks.sh gives a stand-in).
# usage: [SEQ=131072] [LENS="4096 8192 32768"] [REPS=10] [STEP_SPEC=llama3b] [STEP_LEN=8192] [STEP_STEPS=4]
#        tools/gpu-docs-bench.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}/docs-bench
mkdir -p "$out"
. "$(dirname "$0")/check_common.sh"
SEQ=${SEQ:-131072}
LENS=${LENS:-4096 8192 32768}
REPS=${REPS:-10}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
for len in $LENS; do
  GREP="^DOCS 32 8 .*" run "cpgen_$len" 1800 "$B/tests/gpu/bench_attention" --seq "$SEQ" --docs "$len" \
    --reps "$REPS" --quick --no-sdpa --shapes 32/32,32/8 # the peer's shapes
done
GREP="^FLEX 32 8 .*" run flex 3600 "${DOCS_PYTHON:-python3}" tests/gpu/bench_attention_flex.py --seq "$SEQ" --head-dim 128 \
  --docs "$(tr ' ' ',' <<<"$LENS")" --reps "$REPS" --shapes 32/32,32/8

# the table: one row per length and shape from the "DOCS" lines of bench_attention and the "FLEX" lines of the peer;
# a row either lacks fails
table() {
  python3 - "$out" "$SEQ" "$LENS" <<'PY' | tee "$out/table.txt"
import sys
out, S, lens = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split()]
D = 128
def lines(path, tag):
    got = {}
    try:
        for l in open(path):
            w = l.split()
            if len(w) == 6 and w[0] == tag:
                got[(int(w[1]), int(w[2]), int(w[3]))] = (float(w[4]), float(w[5]))
    except OSError:
        pass
    return got
ours = {}
for n in lens:
    ours.update(lines(f"{out}/cpgen_{n}.log", "DOCS"))
flex = lines(f"{out}/flex.log", "FLEX")
def kept(n):
    return sum(min(n, S - a) * (min(n, S - a) + 1) // 2 for a in range(0, S, n))
print(f"document-masked causal attention, S={S}, D={D}, bf16; TF/s on the scores kept (fwd 4*kept*H*D, bwd 2.5x "
      f"fwd); x: cpgen's TF/s over FlexAttention's")
print(f"{'doc len':>7} {'kept':>6} {'shape':<9} | {'cpgen fwd ms':>12} {'bwd ms':>8} {'fwd TF/s':>8} {'bwd TF/s':>8} | "
      f"{'flex fwd ms':>11} {'bwd ms':>8} {'fwd TF/s':>8} {'bwd TF/s':>8} | {'fwd x':>6} {'bwd x':>6}")
missing = []
for n in lens:
    k = kept(n)
    for qh, kvh in ((32, 32), (32, 8)):
        key, shape = (qh, kvh, n), f"{'MHA' if qh == kvh else 'GQA'} {qh}/{kvh}"
        F = 4.0 * k * qh * D
        c, f = ours.get(key), flex.get(key)
        if not c or not f:
            missing.append(f"{shape} at {n}: {'' if c else 'cpgen'}{'' if c or f else ' and '}{'' if f else 'FlexAttention'}")
        cell = lambda t, w: (f"{t[0]:{w}.3f} {t[1]:8.3f} {F / t[0] / 1e9:8.1f} {2.5 * F / t[1] / 1e9:8.1f}" if t
                             else f"{'-':>{w}} {'-':>8} {'-':>8} {'-':>8}")
        ratio = f"{f[0] / c[0]:6.2f} {f[1] / c[1]:6.2f}" if c and f else f"{'-':>6} {'-':>6}"
        print(f"{n:7d} {100 * k / (S * (S + 1) / 2):5.2f}% {shape:<9} | {cell(c, 12)} | {cell(f, 11)} | {ratio}")
for m in missing:
    print(f"FAILED: no times for {m}")
sys.exit(1 if missing else 0)
PY
  return "${PIPESTATUS[0]}"
}
echo
# (check in this shell, not in a pipe: it counts)
check table table

# The training step: STEP_SPEC (default llama3b) at SEQ on one GPU, STEP_STEPS (default 4; 0: none) steps on
# shards of documents of exactly STEP_LEN (default 8192) tokens (random ids, each document's last token its
# end-of-document id, so every sequence holds SEQ / STEP_LEN whole documents), masked against the same tokens with
# data.documents = "stream" (causal over the whole sequence). Each run's predicted step (`cpgen plan`, the time for
# documents of the data's own mean length) comes first, its median step after (the first step left out, as cpgen's
# done: line does).
STEP_SPEC=${STEP_SPEC:-llama3b}
STEP_LEN=${STEP_LEN:-8192}
STEP_STEPS=${STEP_STEPS:-4}
if [ "$STEP_STEPS" -gt 0 ]; then
  sd=$out/step-data
  mkdir -p "$sd"
  vocab=$("$B/cpgen" plan "$STEP_SPEC" --gpus 1 --json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["model"]["vocab"])')
  python3 - "$sd/docs_000.bin" "$SEQ" "$STEP_STEPS" "$STEP_LEN" "${vocab:-0}" <<'PY'
import random, sys
sys.path.insert(0, "tools")
from make_tokens import write_shard
path, S, steps, L, vocab = sys.argv[1], *map(int, sys.argv[2:])
assert vocab > 1, "no vocabulary from cpgen plan"
eod, rng = vocab - 1, random.Random(1)
n = S * steps + 1
toks = [eod if i % L == L - 1 else rng.randrange(vocab - 1) for i in range(n)]
write_shard(path, toks, 2 if vocab <= 1 << 16 else 4, eod)
PY
  for mode in mask stream; do
    args=("$STEP_SPEC" --gpus 1 --seq "$SEQ" --set "data.source=tokens:$sd/docs_*.bin" --set "data.documents=$mode"
      --set "train.steps=$STEP_STEPS" --set train.log_every=1 --set train.save_every=0
      --set "train.out_dir=$out/step_$mode")
    "$B/cpgen" plan "${args[@]}" >"$out/plan_$mode.log" 2>&1
    note "$mode: $(grep -m1 '^predicted step' "$out/plan_$mode.log")"
    GREP='median step [^|]*' run "step_$mode" 900 "$B/cpgen" run "${args[@]}"
  done
  python3 - "$out" "$STEP_SPEC" "$SEQ" "$STEP_LEN" <<'PY' | tee "$out/step.txt"
import re, sys
out, spec, S, L = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def grab(path, pat):
    try: m = re.search(pat, open(path).read())
    except OSError: return None
    return m.group(1) if m else None
def secs(t):
    if t is None: return None
    v, u = re.match(r"([0-9.,]+)\s*(ms|s)", t).groups()
    return float(v.replace(",", "")) / (1000 if u == "ms" else 1)
print(f"{spec} at {S} tokens on one GPU: documents of {L} tokens, masked against the same tokens unmasked")
print(f"{'mode':<7} {'predicted s':>11} {'measured s':>10} {'tok/s':>9} {'attention':>22}")
rows = {}
for mode in ("mask", "stream"):
    pred = secs(grab(f"{out}/plan_{mode}.log", r"predicted step: ([0-9.,]+ m?s)"))
    meas = secs(grab(f"{out}/step_{mode}.log", r"median step ([0-9.,]+ m?s)"))
    try: works = re.findall(r"attention [0-9.]+% of causal", open(f"{out}/step_{mode}.log").read())
    except OSError: works = []
    work = works[-1] if works else None # the last step's
    rows[mode] = meas
    fmt = lambda x, w: f"{x:{w}.2f}" if x else f"{'-':>{w}}"
    print(f"{mode:<7} {fmt(pred, 11)} {fmt(meas, 10)} {S / meas if meas else 0:9,.0f} {work or '-':>22}")
if rows["mask"] and rows["stream"]:
    print(f"masked step {rows['stream'] / rows['mask']:.2f}x faster than unmasked")
PY
fi
finish
