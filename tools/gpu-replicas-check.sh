#!/usr/bin/env bash
# gpu-replicas-check.sh: on a machine of 2 GPUs, with a build tree made elsewhere: replica groups (hybrid sharding)
# against one group doing the same work as micro-batches, sequence for sequence. R replicas of M micro-batches each
# read, in one step, the R x M sequences that one group of R x M micro-batches reads (replica g takes sequences g,
# g + R, ...): `parallel.replicas = 2` of one GPU and 8 micro-batches each (tiny's own) reads sequences 0, 2, ..., 14
# and 1, 3, ..., 15; one GPU with train.micro_batches = 16 reads 0 to 15: the same step, the gradient summed across
# the groups (shard_allreduce) instead of over the micro-batches.
#   1. (curve) tiny trained 20 steps both ways: every step's loss within 1e-3 relative and gradient norm within 1e-2
#      relative (the bounds of tests/gpu/test_parallel.c, 1 GPU against N); the replicas' measured peak per GPU
#      within 1% of the plan's.
#   2. (hybrid, with 4 GPUs) 2 replicas of 2 GPUs each (Ulysses inside, shard all-reduce across), 8 micro-batches
#      each, the same comparison against 2 GPUs with 16 micro-batches.
#   3. (resume, with curve) the replicas' step-10 checkpoint resumed as replicas: steps 11-20 within 1e-3 of the
#      uninterrupted run.
# Exit 0 when every comparison holds, 1 when one fails, 77 when a part could not run here (tools/check_common.sh).
# usage: [PARTS="curve resume hybrid"] tools/gpu-replicas-check.sh [BUILD_DIR]; logs under $OUT.
set -u
B=${1:-build}
out=${OUT:-out}/replicas-check
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
PARTS=${PARTS:-curve resume hybrid}
. "$(dirname "$0")/check_common.sh"
M=8 # micro-batches per replica; the one group beside them runs 2 x M
common=(--set train.steps=20 --set train.warmup=5 --set parallel.upipe_heads=2 --set train.save_every=10)

if want curve && need_gpus 2 curve; then
  CUDA_VISIBLE_DEVICES=0 run one_gpu_mb$((2 * M)) 300 "$B/cpgen" run tiny "${common[@]}" \
    --set train.micro_batches=$((2 * M)) --set "train.out_dir=$out/runs/mb$((2 * M))"
  CUDA_VISIBLE_DEVICES=0,1 run replicas2 300 "$B/cpgen" run tiny --gpus 2 --set parallel.gpus=1 \
    --set parallel.replicas=2 "${common[@]}" --set train.micro_batches=$M --set "train.out_dir=$out/runs/rep2"
  compare "$out/runs/mb$((2 * M))/metrics.jsonl" "$out/runs/rep2/metrics.jsonl" 20
fi

if want resume; then
  if ! want curve; then
    fail "resume: resumes the curve part's checkpoint; PARTS must hold curve too"
  elif need_gpus 2 resume; then
    CUDA_VISIBLE_DEVICES=0,1 run replicas2_resume 300 "$B/cpgen" run tiny --gpus 2 --set parallel.gpus=1 \
      --set parallel.replicas=2 "${common[@]}" --set train.micro_batches=$M \
      --set "train.out_dir=$out/runs/rep2_resume" --resume "$out/runs/rep2/ckpt_10"
    compare "$out/runs/rep2/metrics.jsonl" "$out/runs/rep2_resume/metrics.jsonl" 20 11
  fi
fi

if want hybrid && need_gpus 4 "hybrid (groups of 2 GPUs x 2 replicas)"; then
  CUDA_VISIBLE_DEVICES=0,1 run two_gpu_mb$((2 * M)) 300 "$B/cpgen" run tiny --gpus 2 "${common[@]}" \
    --set train.micro_batches=$((2 * M)) --set "train.out_dir=$out/runs/g2mb$((2 * M))"
  CUDA_VISIBLE_DEVICES=0,1,2,3 run replicas2_gpus2 300 "$B/cpgen" run tiny --gpus 2 --set parallel.replicas=2 \
    "${common[@]}" --set train.micro_batches=$M --set "train.out_dir=$out/runs/rep2g2"
  compare "$out/runs/g2mb$((2 * M))/metrics.jsonl" "$out/runs/rep2g2/metrics.jsonl" 20
fi
finish
