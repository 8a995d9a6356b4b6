#!/usr/bin/env bash
# gpu-ring-check.sh: on a machine of 2 GPUs, with a build tree made elsewhere: ring attention across groups against
# one GPU doing the same work. `parallel.ring = 2` of one GPU each holds zigzag chunks 0, 3 and 1, 2 of every
# sequence, passes K/V blocks (forward) and dK, dV (backward) between the two over send/recv, and all-reduces its
# gradient shards across the groups; one GPU trains the whole sequence. Both plans use one query head per UPipe stage
# (parallel.upipe_heads = 1) unless said.
#   1. (grads) build/tests/gpu/test_parallel's ring cases: the gradients of one step, tiny (one and two query heads
#      per stage) and 2 layers of the 8B shape at 16K, 1 GPU against ring 2 x 1 GPU: loss within 1e-3 relative,
#      every tensor's gradient with cosine >= 0.999 and its norm within 1e-2.
#   2. (curve) tiny trained 20 steps both ways: every step's loss within 1e-3 relative and gradient norm within 1e-2
#      relative (the bounds of test_parallel); the ring's measured peak per GPU within 1% of the plan's.
#   3. (resume, with curve) the ring's step-10 checkpoint resumed as a ring: steps 11-20 within 1e-3 of the
#      uninterrupted run.
#   4. (comm) communication the attention does not hide: the 8B shape's 2 layers at 64K on ring 2 x 1 GPU, its
#      second step with its send/recvs and all-reduces and without them (CPGEN_BENCH_SKIP_COMM=1), beside the plan's
#      exposed time.
# Exit 0 when every comparison holds, 1 when one fails, 77 when a part could not run here (tools/check_common.sh).
# usage: [PARTS="grads curve resume comm"] tools/gpu-ring-check.sh [BUILD_DIR]; logs under $OUT.
set -u
B=${1:-build}
out=${OUT:-out}/ring-check
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
PARTS=${PARTS:-grads curve resume comm}
. "$(dirname "$0")/check_common.sh"
common=(--set train.steps=20 --set train.warmup=5 --set parallel.upipe_heads=1 --set train.save_every=10)
ring=(--set parallel.gpus=1 --set parallel.ring=2)

if want grads && need_gpus 2 grads; then
  GREP='[0-9]+ of [0-9]+ cases agree' CPGEN_TEST_GPUS=2 CPGEN_TEST_CASES="tiny_ring2 l8b_ring2" OUT=$out \
    run test_parallel_ring 600 "$B/tests/gpu/test_parallel"
  grep -E "1 vs 2 GPUs" "$out/test_parallel_ring.log" | tee -a "$sum"
fi

if want curve && need_gpus 2 curve; then
  CUDA_VISIBLE_DEVICES=0 run one_gpu 300 "$B/cpgen" run tiny "${common[@]}" --set "train.out_dir=$out/runs/one"
  CUDA_VISIBLE_DEVICES=0,1 run ring2 300 "$B/cpgen" run tiny "${ring[@]}" "${common[@]}" \
    --set "train.out_dir=$out/runs/ring2"
  compare "$out/runs/one/metrics.jsonl" "$out/runs/ring2/metrics.jsonl" 20
fi

if want resume; then
  if ! want curve; then
    fail "resume: resumes the curve part's checkpoint; PARTS must hold curve too"
  elif need_gpus 2 resume; then
    CUDA_VISIBLE_DEVICES=0,1 run ring2_resume 300 "$B/cpgen" run tiny "${ring[@]}" "${common[@]}" \
      --set "train.out_dir=$out/runs/ring2_resume" --resume "$out/runs/ring2/ckpt_10"
    compare "$out/runs/ring2/metrics.jsonl" "$out/runs/ring2_resume/metrics.jsonl" 20 11
  fi
fi

if want comm && need_gpus 2 comm; then
  l8b=(llama8b "${ring[@]}" --set parallel.upipe_heads=1 --set model.layers=2 --seq 64K --set train.steps=2
    --set train.warmup=0)
  "$B/cpgen" plan "${l8b[@]}" | grep -E "^predicted step|send/recv" | sed 's/^/  plan: /' | tee -a "$sum"
  for skip in 0 1; do
    CUDA_VISIBLE_DEVICES=0,1 CPGEN_BENCH_SKIP_COMM=$skip run "l8b_64k_skip$skip" 600 "$B/cpgen" run "${l8b[@]}" \
      --set "train.out_dir=$out/runs/l8b_64k_skip$skip"
  done
  # figures, no bound; it fails where a run left no second step to read
  check comm python3 - "$out/runs/l8b_64k_skip0/metrics.jsonl" "$out/runs/l8b_64k_skip1/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(a) == len(b) == 2, f"{len(a)} and {len(b)} steps, not 2 each"
t, t0 = a[-1]["seconds"], b[-1]["seconds"]
print(f"8B, 2 layers, 64K on ring 2 x 1 GPU, step 2: {t:.3f} s, {t0:.3f} s without communication: {t - t0:.3f} s "
      f"not hidden")
PY
fi
finish
