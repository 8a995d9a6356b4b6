#!/usr/bin/env bash
# gpu-replicas-check.sh: on a machine of 2 GPUs, with a build tree made elsewhere: replica groups (hybrid sharding)
# against one GPU doing the same work as micro-batches. `parallel.replicas = 2` of one GPU each reads sequences 0, 2,
# ... and 1, 3, ...; one GPU with train.micro_batches = 2 reads sequences 0 and 1, 2 and 3, ... in one step: the same
# step, the gradient summed across the groups (shard_allreduce) instead of over the micro-batches.
#   1. (curve) tiny trained 20 steps both ways: every step's loss within 1e-3 relative and gradient norm within 1e-2
#      relative (the bounds of tests/gpu/test_parallel.c, 1 GPU against N); the replicas' measured peak per GPU
#      within 1% of the plan's.
#   2. (hybrid, with 4 GPUs) 2 replicas of 2 GPUs each (Ulysses inside, shard all-reduce across), the
#      same comparison against 2 GPUs with 2 micro-batches.
#   3. (resume) the replicas' step-10 checkpoint resumed as replicas: steps 11-20 within 1e-3 of the uninterrupted run.
# usage: [PARTS="curve resume hybrid"] tools/gpu-replicas-check.sh [BUILD_DIR]; logs under $OUT.
set -u
B=${1:-build}
out=${OUT:-out}/replicas-check
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
PARTS=${PARTS:-curve resume hybrid}
. "$(dirname "$0")/check_common.sh"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
common=(--set train.steps=20 --set train.warmup=5 --set parallel.upipe_heads=2 --set train.save_every=10)

if want curve; then
  CUDA_VISIBLE_DEVICES=0 run one_gpu_mb2 300 "$B/cpgen" run tiny "${common[@]}" --set train.micro_batches=2 \
    --set "train.out_dir=$out/runs/mb2"
  CUDA_VISIBLE_DEVICES=0,1 run replicas2 300 "$B/cpgen" run tiny --gpus 2 --set parallel.gpus=1 \
    --set parallel.replicas=2 "${common[@]}" --set "train.out_dir=$out/runs/rep2"
  compare "$out/runs/mb2/metrics.jsonl" "$out/runs/rep2/metrics.jsonl"
fi

if want resume && want curve; then
  CUDA_VISIBLE_DEVICES=0,1 run replicas2_resume 300 "$B/cpgen" run tiny --gpus 2 --set parallel.gpus=1 \
    --set parallel.replicas=2 "${common[@]}" --set "train.out_dir=$out/runs/rep2_resume" \
    --resume "$out/runs/rep2/ckpt_10"
  compare "$out/runs/rep2/metrics.jsonl" "$out/runs/rep2_resume/metrics.jsonl" 11
fi

if want hybrid; then
  if [ "$gpus" -ge 4 ]; then
    CUDA_VISIBLE_DEVICES=0,1 run two_gpu_mb2 300 "$B/cpgen" run tiny --gpus 2 "${common[@]}" \
      --set train.micro_batches=2 --set "train.out_dir=$out/runs/g2mb2"
    CUDA_VISIBLE_DEVICES=0,1,2,3 run replicas2_gpus2 300 "$B/cpgen" run tiny --gpus 2 --set parallel.replicas=2 \
      "${common[@]}" --set "train.out_dir=$out/runs/rep2g2"
    compare "$out/runs/g2mb2/metrics.jsonl" "$out/runs/rep2g2/metrics.jsonl"
  else
    note "hybrid: skipped ($gpus GPUs; groups of 2 GPUs x 2 replicas need 4)"
  fi
fi
echo "summary: $sum"
