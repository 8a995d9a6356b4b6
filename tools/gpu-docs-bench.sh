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
# usage: [SEQ=131072] [LENS="4096 8192 32768"] [REPS=10] tools/gpu-docs-bench.sh [BUILD_DIR]
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
    --reps "$REPS" --quick --no-sdpa
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
finish
