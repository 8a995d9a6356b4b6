#!/usr/bin/env bash
# gpu-parallel-check.sh: on a machine of 2 (or more) GPUs, with a build tree made elsewhere: the parallel path
# against one GPU and against transformers, memory per GPU against the plan, and the speed of the 2-GPU step.
#   1. build/tests/gpu/test_parallel: gradients of one step, 1 GPU against N (UPipe, Ulysses, KV heads fewer than
#      GPUs, GQA 3, micro-batches, Qwen3 tied, the 8B shape at 16K and 64K).
#   2. tiny trained 20 steps on 1 and on N GPUs (`cpgen run --gpus`): the loss curves side by side, and on N GPUs
#      with the optimizer in host memory against the GPU's; (resume) each run's step-10 checkpoint resumed on the
#      other GPU count, steps 11-20 against that count's own run.
#   3. transformers through the N-GPU path: tests/gpu/hf_check.sh's tiny case, cpgen's curve taken from `cpgen run
#      --gpus N` on the same weights and tokens.
#   4. the 3B shape on N GPUs at 128K (full depth) and 512K (2 layers), one step: measured peak per GPU against the
#      plan; at 128K with UPipe stages of N heads and with plain Ulysses (24 heads); then (speed) tokens/s at 256K
#      and the 8B shape at 128K.
#   5. (fault) two ranks under launcher variables, rank 1 killed mid-run: rank 0 stops by itself, saying why.
#   6. (comm) communication not hidden behind compute: the 3B 128K step and the 8B 128K step with their collectives
#      and without them (CPGEN_BENCH_SKIP_COMM=1), the difference of their second steps; and the 3B step's profile
#      (CPGEN_PROFILE): measured time per kind of step and per stream beside the cost model's.
#   7. (ws) the attention working set of UPipe (U = N) against Ulysses (U = 24) where it is live at the peak: the 3B
#      shape at 512K as 2 layers, one step each, measured peaks beside the plan's; (mem512) the full-depth 512K step.
# The longest lengths on N GPUs: `GPUS=N PARTS=longest tools/gpu-memory-check.sh`.
# Exit 0 when every check holds, 1 when one fails, 77 when fewer than N GPUs are here (tools/check_common.sh).
# usage: [GPUS=2] [PARTS="grads curve resume hf fault mem speed comm ws mem512"] [COMM_SPECS="llama3b llama8b"]
#   tools/gpu-parallel-check.sh [BUILD_DIR]; logs under $OUT.
set -u
B=${1:-build}
N=${GPUS:-2}
out=${OUT:-out}/parallel-check
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
PARTS=${PARTS:-grads curve resume hf fault mem speed comm ws mem512}
. "$(dirname "$0")/check_common.sh"
need_gpus "$N" "every part (GPUS=$N)" || finish
done_line() { grep -E "^done:" "$out/$1.log" | sed 's/^done: //'; }
# upipe_vs_ulysses SEQ LAYERS: the 3B shape with UPipe stages of N heads and of all 24, the plan's attention working
# set beside one step's measured peak
upipe_vs_ulysses() {
  local u sets
  for u in "$N" 24; do
    sets=(--seq "$1" --set model.layers="$2" --set parallel.upipe_heads=$u)
    "$B/cpgen" plan llama3b --gpus "$N" "${sets[@]}" | grep -E "attention working set" | sed "s/^/  plan U=$u: /" |
      tee -a "$sum"
    run "l3b_$1_$2l_u$u" 300 "$B/cpgen" run llama3b --gpus "$N" "${sets[@]}" --set train.steps=1 \
      --set train.warmup=0 --set "train.out_dir=$out/runs/l3b_$1_$2l_u$u"
    note "  3B $1, $2 layers, U=$u: $(done_line "l3b_$1_$2l_u$u")"
  done
}

want grads && CPGEN_TEST_GPUS=$N OUT=$out run test_parallel 400 "$B/tests/gpu/test_parallel"

if want curve; then
  for g in 1 "$N"; do
    run "tiny_curve_$g" 120 "$B/cpgen" run tiny --gpus "$g" --set train.steps=20 --set train.warmup=5 \
      --set train.micro_batches=2 --set parallel.upipe_heads=2 --set train.save_every=10 \
      --set "train.out_dir=$out/runs/curve$g"
  done
  compare_loss "tiny 20 steps, 1 vs $N GPUs" "$out/runs/curve1/metrics.jsonl" "$out/runs/curve$N/metrics.jsonl" 20
  # the optimizer in host memory on every rank (each updates its shard on the CPU) against the GPU's
  run "tiny_curve_${N}_host" 120 "$B/cpgen" run tiny --gpus "$N" --set train.steps=20 --set train.warmup=5 \
    --set train.micro_batches=2 --set parallel.upipe_heads=2 --set parallel.optimizer=host \
    --set "train.out_dir=$out/runs/curve${N}_host"
  compare_loss "tiny 20 steps on $N GPUs, optimizer on the host vs the GPU" "$out/runs/curve$N/metrics.jsonl" \
    "$out/runs/curve${N}_host/metrics.jsonl" 20
fi

if want resume && ! want curve; then
  fail "resume: resumes the curve part's checkpoints; PARTS must hold curve too"
elif want resume; then
  # each curve's checkpoint at step 10, resumed on the other GPU count: steps 11-20 against the uninterrupted run
  # of that count (the first 10 steps were summed in another order, hence a bound and not bit equality)
  for from in 1 "$N"; do
    to=$((from == 1 ? N : 1))
    run "resume_${from}_to_$to" 120 "$B/cpgen" run tiny --gpus "$to" --set train.steps=20 --set train.warmup=5 \
      --set train.micro_batches=2 --set parallel.upipe_heads=2 --set "train.out_dir=$out/runs/resume$from" \
      --resume "$out/runs/curve$from/ckpt_10"
    compare_loss "resumed on $to GPU(s) from $from GPU(s)' step 10, against the uninterrupted run" \
      "$out/runs/curve$to/metrics.jsonl" "$out/runs/resume$from/metrics.jsonl" 20 11
  done
fi

if want hf; then
  d=/tmp/cpgen-hf-par
  OUT=$out HF_WORK=$d run hf_1gpu 600 tests/gpu/hf_check.sh "$B" tiny
  run hf_run_n 120 "$B/cpgen" run tiny --gpus "$N" --set train.steps=20 --set train.warmup=5 \
    --set init.from=hf --set "init.path=$d/tiny/model" --set "train.out_dir=$d/tiny/run_n"
  # the one-GPU export's metrics are replaced by the N-GPU run's: a run that left none must not leave the old ones
  rm -f "$d/tiny/metrics.jsonl"
  cp "$d/tiny/run_n/metrics.jsonl" "$d/tiny/metrics.jsonl"
  run hf_compare_n 300 python3 tests/gpu/hf_compare.py "$d/tiny"
  note "transformers against cpgen on $N GPUs: $(grep -E '^loss curve' "$out/hf_compare_n.log") $(tail -1 "$out/hf_compare_n.log")"
fi

if want mem; then
  # 512K at full depth is a 6-minute step on 2 GPUs: as 2 layers, beside the full plan's peak
  for s in 128K 512K; do
    layers=28
    [ "$s" = 512K ] && layers=2
    run "l3b_mem_$s" 500 "$B/cpgen" run llama3b --gpus "$N" --seq "$s" --set model.layers=$layers \
      --set train.steps=1 --set train.warmup=0 --set "train.out_dir=$out/runs/l3b_$s"
    note "  3B $s on $N GPUs, $layers layers: $(done_line "l3b_mem_$s") | 28 layers by the plan: $("$B/cpgen" plan \
      llama3b --gpus "$N" --seq "$s" | grep -E '^  peak' | head -1 | tr -s ' ')"
  done
  upipe_vs_ulysses 128K 28
fi

if want speed; then
  run l3b_256k 500 "$B/cpgen" run llama3b --gpus "$N" --seq 256K --set train.steps=3 --set train.warmup=1 \
    --set "train.out_dir=$out/runs/l3b_256k"
  note "  3B 256K on $N GPUs: $(done_line l3b_256k)"
  run l8b_128k 500 "$B/cpgen" run llama8b --gpus "$N" --seq 128K --set train.steps=3 --set train.warmup=1 \
    --set "train.out_dir=$out/runs/l8b_128k"
  note "  8B 128K on $N GPUs: $(done_line l8b_128k)"
fi
if want fault; then
  # two ranks started as a launcher would (no parent watching them); rank 1 is killed mid-run: rank 0 must stop on
  # its own, within its deadline (CPGEN_NCCL_TIMEOUT=20 s), with a message naming itself and what it waited for
  port=$((29500 + RANDOM % 1000))
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      CPGEN_NCCL_TIMEOUT=20 "$B/cpgen" run tiny --gpus 2 --set train.steps=100000 --set train.warmup=10 \
      --set "train.out_dir=$out/runs/fault" >"$out/fault_rank$r.log" 2>&1 &
    pids[$r]=$!
  done
  stepping=0
  for _ in $(seq 60); do grep -q "^step " "$out/fault_rank0.log" && { stepping=1; break; }; sleep 1; done
  [ $stepping = 1 ] || fail "fault: rank 0 printed no step line within 60 s: rank 1 is killed before the run is under way"
  kill -9 "${pids[1]}"
  t0=$(date +%s)
  hung=0
  timeout 120 tail --pid="${pids[0]}" -f /dev/null || { kill -9 "${pids[0]}"; hung=1; }
  wait "${pids[0]}"
  rc=$?
  msg=$(grep -E '^cpgen:' "$out/fault_rank0.log" | tail -1 | cut -c1-300)
  note "fault: rank 1 killed; rank 0 exited rc=$rc after $(($(date +%s) - t0)) s: $msg"
  # rank 0 must stop by itself, with a failure status and a message that names it
  if [ $hung = 1 ]; then
    fail "fault: rank 0 HUNG (killed after 120 s)"
  elif [ $rc = 0 ] || [[ $msg != *"rank 0"* ]]; then
    fail "fault: rank 0 exited rc=$rc with ${msg:-no cpgen: line}: expected a failure status and a message naming rank 0"
  else
    pass
  fi
fi

if want comm; then
  for spec in ${COMM_SPECS:-llama3b llama8b}; do
    for skip in 0 1; do
      # the 3B run with communication times a third step plan step by plan step (CPGEN_PROFILE): where it goes
      steps=$([ $spec = llama3b ] && [ $skip = 0 ] && echo 3 || echo 2)
      CPGEN_PROFILE=$((steps == 3 ? 3 : 0)) CPGEN_BENCH_SKIP_COMM=$skip run "${spec}_comm_$skip" 300 "$B/cpgen" run \
        "$spec" --gpus "$N" --seq 128K --set train.steps=$steps --set train.warmup=1 \
        --set "train.out_dir=$out/runs/${spec}_comm_$skip"
    done
    sed -n '/^profile of the step/,/^step /p' "$out/${spec}_comm_0.log" | head -34 | tee -a "$sum"
    # figures, no bound; it fails where a run left no second step to read
    check "comm $spec" python3 - "$out/runs/${spec}_comm_0/metrics.jsonl" "$out/runs/${spec}_comm_1/metrics.jsonl" \
      "$spec" <<'PY'
import json, sys
t = [json.loads(list(open(f))[1])["seconds"] for f in sys.argv[1:3]]  # the second step of each
print(f"{sys.argv[3]} 128K: step {t[0]:.2f} s with communication, {t[1]:.2f} s without: "
      f"{t[0] - t[1]:.2f} s ({100 * (t[0] - t[1]) / t[0]:.1f}%) not hidden")
PY
  done
fi
want ws && upipe_vs_ulysses 512K 2
if want mem512; then
  run l3b_512k_full 560 "$B/cpgen" run llama3b --gpus "$N" --seq 512K --set train.steps=1 --set train.warmup=0 \
    --set "train.out_dir=$out/runs/l3b_512k_full"
  note "  3B 512K on $N GPUs, 28 layers: $(done_line l3b_512k_full)"
fi
echo
cat "$sum"
grep -E "agree|DIFFER|cases" "$out/test_parallel.log" 2>/dev/null
finish
