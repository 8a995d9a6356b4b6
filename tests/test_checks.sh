#!/usr/bin/env bash
# test_checks.sh: the GPU checks' verdicts, proven without a GPU (run by tests/test_checks.c from the source tree).
#   1. With nvidia-smi listing no GPU (a stand-in first on PATH), every check script (tools/gpu-*.sh,
#      tools/bench-train.sh, tests/gpu/hf_check.sh, examples/eight_gpus.sh) says "skipped: no GPU" and exits 77
#      before running anything.
#   2. With a stand-in listing GPUs, tools/check_common.sh's helpers on made-up runs: compare passes two equal
#      metrics files and fails one cut short, one run on, one with a step twice, one missing or empty, a loss, norm or
#      memory over its bound, a loss that is null; run counts exit 0, failures, time limits and skips (77 with and
#      without the line saying why); need_gpus, check, expect, and finish's exit status (0, 1, 77; nothing checked
#      fails).
#   3. Whole scripts (gpu-replicas-check.sh, gpu-ring-check.sh, gpu-parallel-check.sh, gpu-relayout-check.sh,
#      gpu-real-text-run.sh, gpu-fp8-bench.sh) on a stand-in cpgen that writes made-up metrics: they pass like with
#      like, fail a run cut short (or run on), over its bound (or its planned memory) or failing (the real-text run's
#      ORACLE=1 also a stand-in evaluator that disagrees with the bf16 run or scores other targets; the relayout check
#      also a resume that takes another seq_len unasked or does not note the layout), and end 77 where a part lacks GPUs; gpu-eval-check.sh on one that evaluates: it
#      passes when training with evaluations is training without and val_loss is step 1's at lr = 0, and fails a
#      last-digit difference, a val_loss 1e-4 off, a run that did not evaluate or failed, and a failed GPU test (77
#      when that test is skipped); gpu-ckpt-check.sh on a stand-in of its own passes, and fails a save over its
#      stall, checkpoints that differ, resumed losses that differ and ranks that stop after different steps;
#      tests/gpu/hf_check.sh with the real cpgen's plan and stand-ins for test_train_tiny (which hands its overrides
#      to the real `cpgen plan`) and for Python: every case's command line is one cpgen takes, and the script passes
#      when every comparison matches and fails a case whose comparison misses, a packed case compared without its
#      documents, a case it does not know and an override cpgen refuses; tools/gpu-docs-bench.sh on stand-ins of
#      bench_attention and of its FlexAttention peer gives the table with both and their ratio, and fails a run
#      that fails and a row a run left out; tools/gpu-attention-profile.sh on stand-ins of ncu and bench_attention
#      asks ncu for one launch of each direction's kernel, takes only the metrics ncu lists, and its table
#      (tools/ncu_summary.py on made-up raw pages) has each figure, n/a for a metric missing, the top stalls without
#      'selected'; it fails a launch ncu did not profile and a bench that fails, and skips without ncu;
#      tools/hf_val_loss.py cuts sequences and documents as cpgen does and refuses bad shards.
#   4. tools/run-tests.sh counts passed, failed and skipped tests and exits 0, 1 or 77.
# Prints one line per case; exit 0 when every case gives the status it should, else 1. KEEP=1 leaves the scratch
# folder (/tmp/cpgen-test-checks-*) to look at.
set -u
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d /tmp/cpgen-test-checks-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
bad=0
# expect_rc WANT WHAT RC OUTPUT_FILE [PATTERN]: a case's exit status and, when given, a line of its output
expect_rc() {
  local want=$1 what=$2 rc=$3 log=$4 pat=${5:-}
  if [ "$rc" != "$want" ]; then
    echo "FAIL $what: exit $rc, expected $want; its output:"
    sed 's/^/    /' "$log"
    bad=1
  elif [ -n "$pat" ] && ! grep -qE "$pat" "$log"; then
    echo "FAIL $what: exit $rc, but no line matching \"$pat\"; its output:"
    sed 's/^/    /' "$log"
    bad=1
  else
    echo "ok   $what: exit $rc"
  fi
}

# stand-ins for nvidia-smi: one that finds no GPU (as the real one says it), one listing $FAKE_GPUS of them
mkdir -p "$tmp/nogpu" "$tmp/gpus"
printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' >"$tmp/nogpu/nvidia-smi"
cat >"$tmp/gpus/nvidia-smi" <<'SH'
#!/bin/sh
i=0
while [ "$i" -lt "${FAKE_GPUS:-2}" ]; do echo "GPU $i: Stand-in (UUID: GPU-$i)"; i=$((i + 1)); done
SH
chmod +x "$tmp/nogpu/nvidia-smi" "$tmp/gpus/nvidia-smi"

# 1. no GPU: every script skips at once. A fake build dir whose binaries would say if they ran.
mkdir -p "$tmp/build/tests/gpu"
for f in cpgen tests/gpu/test_parallel tests/gpu/test_train_tiny tests/gpu/test_attention; do
  printf '#!/bin/sh\necho RAN "$0"; touch %s/ran\n' "$tmp" >"$tmp/build/$f"
  chmod +x "$tmp/build/$f"
done
for s in tools/gpu-*.sh tools/bench-train.sh tests/gpu/hf_check.sh examples/eight_gpus.sh; do
  PATH="$tmp/nogpu:$PATH" OUT="$tmp/out" HF_WORK="$tmp/hf" timeout 60 bash "$s" "$tmp/build" >"$tmp/log" 2>&1
  rc=$?
  [ ! -e "$tmp/ran" ] || { echo "    (it ran $(grep -m1 RAN "$tmp/log"))" >>"$tmp/log"; rc="$rc, ran a binary"; }
  rm -f "$tmp/ran"
  expect_rc 77 "$s without a GPU" "$rc" "$tmp/log" "skipped: no GPU"
done

# 2. the helpers, each case a script sourcing check_common.sh with made-up metrics
m="$tmp/m"
mkdir -p "$m"
# made-up runs, "NAME FROM TO [LOSS_SCALE NORM_SCALE MEM_SCALE]" a line: m/NAME.jsonl holds steps FROM..TO
python3 - "$m" <<'PY'
import json, sys
runs = """ref 1 20
same 1 20
close 1 20 1.0005 1.005 1.005
short 1 15
long 1 21
loss_over 1 20 1.002
norm_over 1 20 1 1.02
mem_over 1 20 1 1 1.02
resumed 11 20
resumed_short 11 19"""
for line in runs.splitlines():
    name, a, b, *k = line.split()
    ls, ns, ms = (float(x) for x in (k + ["1", "1", "1"])[:3])
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as o:
        for s in range(int(a), int(b) + 1):
            o.write(json.dumps({"step": s, "loss": (6.3 - 0.01 * s) * ls, "norm": (1.5 + 0.1 * s) * ns,
                                "seconds": 0.1, "mem_measured": int(1e9 * ms), "mem_planned": int(1e9),
                                "skipped": False}) + "\n")
PY
cat "$m/ref.jsonl" "$m/resumed.jsonl" >"$m/resumed_twice.jsonl" # steps 11-20 twice
head -5 "$m/ref.jsonl" >"$m/nulled.jsonl"
sed -n '6p' "$m/ref.jsonl" | sed 's/"loss": [0-9.]*/"loss": null/' >>"$m/nulled.jsonl"
tail -n +7 "$m/ref.jsonl" >>"$m/nulled.jsonl"
: >"$m/empty.jsonl"

# helper WANT WHAT [GPUS] <<'SH' body: source check_common.sh (PARTS="a b"), run the body, then finish
helper() {
  local want=$1 what=$2 n=${3:-2}
  mkdir -p "$tmp/h"
  { printf 'out=%q\nPARTS="a b"\n. tools/check_common.sh\nm=%q\n' "$tmp/h" "$m"; cat; echo finish; } >"$tmp/case.sh"
  PATH="$tmp/gpus:$PATH" FAKE_GPUS=$n timeout 60 bash "$tmp/case.sh" >"$tmp/log" 2>&1
  expect_rc "$want" "$what" $? "$tmp/log" "${PAT:-}"
}
helper 0 "compare: two equal runs" <<<'compare $m/ref.jsonl $m/same.jsonl 20'
helper 0 "compare: within every bound" <<<'compare $m/ref.jsonl $m/close.jsonl 20'
PAT="steps 1-15 in 15 lines" helper 1 "compare: a run cut short" <<<'compare $m/ref.jsonl $m/short.jsonl 20'
helper 1 "compare: the reference cut short" <<<'compare $m/short.jsonl $m/ref.jsonl 20'
helper 1 "compare: both cut short alike" <<<'compare $m/short.jsonl $m/short.jsonl 20'
helper 1 "compare: a run that ran on" <<<'compare $m/ref.jsonl $m/long.jsonl 20'
PAT="loss 2.00e-03" helper 1 "compare: loss over 1e-3" <<<'compare $m/ref.jsonl $m/loss_over.jsonl 20'
helper 1 "compare: norm over 1e-2" <<<'compare $m/ref.jsonl $m/norm_over.jsonl 20'
helper 1 "compare: memory 2% over the plan" <<<'compare $m/ref.jsonl $m/mem_over.jsonl 20'
helper 1 "compare: a null loss" <<<'compare $m/ref.jsonl $m/nulled.jsonl 20'
helper 1 "compare: a missing file" <<<'compare $m/ref.jsonl $m/none.jsonl 20'
helper 1 "compare: an empty file" <<<'compare $m/empty.jsonl $m/ref.jsonl 20'
helper 0 "compare: a resumed run, steps 11-20" <<<'compare $m/ref.jsonl $m/resumed.jsonl 20 11'
helper 1 "compare: a resumed run cut short" <<<'compare $m/ref.jsonl $m/resumed_short.jsonl 20 11'
helper 1 "compare: a resumed run with its steps twice" <<<'compare $m/ref.jsonl $m/resumed_twice.jsonl 20 11'
helper 0 "compare_loss: the norm and memory not its business" <<<'compare_loss "curve" $m/ref.jsonl $m/mem_over.jsonl 20'
helper 1 "compare_loss: loss over 1e-3" <<<'compare_loss "curve" $m/ref.jsonl $m/loss_over.jsonl 20'
helper 1 "compare_loss: cut short" <<<'compare_loss "curve" $m/ref.jsonl $m/short.jsonl 20'
helper 1 "compare: one good, one over: the script fails" <<'SH'
compare $m/ref.jsonl $m/same.jsonl 20
compare $m/ref.jsonl $m/loss_over.jsonl 20
SH
helper 0 "run: exit 0" <<<'run ok 10 true'
PAT="FAILED +bad: exit status 3" helper 1 "run: a non-zero exit" <<<'run bad 10 sh -c "exit 3"'
PAT="killed by its time limit" helper 1 "run: killed by its time limit" <<<'run slow 1 sleep 20'
PAT="skipped +sk: needs 2 GPUs" helper 77 "run: a skip (77 saying why)" \
  <<<'run sk 10 sh -c "echo \"t: skipped: needs 2 GPUs\"; exit 77"'
helper 1 "run: 77 without saying skipped" <<<'run sk 10 sh -c "exit 77"'
helper 1 "run: a skip and a failure" <<'SH'
run sk 10 sh -c 'echo "t: skipped: why"; exit 77'
run bad 10 false
SH
PAT="skipped +hybrid \(needs 4 GPUs, this machine has 2\)" helper 77 "need_gpus: too few GPUs" <<'SH'
run ok 10 true
need_gpus 4 hybrid && run never 10 false
SH
helper 0 "need_gpus: enough" 4 <<<'need_gpus 4 hybrid && run ok 10 true'
helper 1 "check: a bound missed inline" <<'SH'
check bound python3 - 2e-3 <<'PY'
import sys
worst = float(sys.argv[1])
print(f"worst {worst:.2e} {'(within 1e-3)' if worst <= 1e-3 else 'OVER 1e-3'}")
sys.exit(0 if worst <= 1e-3 else 1)
PY
SH
helper 0 "check: a bound kept" <<<'check bound python3 -c "print(1)"'
helper 0 "expect: the line is there" <<<'run says 10 echo "step 2/2"; expect says "^step 2/2"'
helper 1 "expect: the line is missing" <<<'run says 10 echo "step 1/2"; expect says "^step 2/2"'
helper 1 "fail: recorded" <<<'run ok 10 true; fail "plan: the cached winner was not taken"'
PAT="nothing was checked" helper 1 "finish: nothing checked" <<<'want c && run never 10 true'

# 3. whole scripts on a stand-in cpgen: it writes each run's metrics.jsonl (one line per step, and its step-10
# checkpoint folder), the loss a function of the step and of the sequences a step reads (micro-batches x replicas,
# tiny's 8 micro-batches unless set), so that only like compared with like agrees. FAKE_CUT=NAME stops runs whose
# out_dir holds NAME after 15 steps with exit 0 (a run cut short), FAKE_OFF=NAME moves their loss by 2e-3,
# FAKE_MEM=NAME their measured memory 2% above the plan, FAKE_FAIL=NAME makes them exit 1; train.lr moves the loss by
# 1.5% for every 10% away from 3e-4. Its plan prints a predicted step of 0.10 s.
mkdir -p "$tmp/sim/tests/gpu"
# realplan run SPEC ARGS...: the stand-ins' check of their command line with the real cpgen (REAL_CPGEN): its
# spec and settings (--set, --gpus, --seq) go to `cpgen plan`, so that a run the real cpgen would refuse (a
# setting out of range, a key that does not exist) is refused by the stand-in too, with the real message
cat >"$tmp/realplan" <<'SH'
#!/usr/bin/env bash
[ -n "${REAL_CPGEN:-}" ] || exit 0
sets=()
for ((i = 3; i <= $#; i++)); do
  case ${!i} in --set | --gpus | --seq) j=$((i + 1)); sets+=("${!i}" "${!j}") ;; esac
done
why=$("$REAL_CPGEN" plan "$2" "${sets[@]}" 2>&1 >/dev/null) || { echo "$why" >&2; exit 2; }
SH
chmod +x "$tmp/realplan"
export REAL_CPGEN="$PWD/build/cpgen"
cat >"$tmp/sim/cpgen" <<'SH'
#!/usr/bin/env bash
set -u
[ "${1:-}" != plan ] || { echo "stand-in cpgen: $*"; echo "predicted step: 0.10 s (stand-in)"; exit 0; }
[ "${1:-}" = run ] || { echo "stand-in cpgen: $*"; exit 0; }
"$(dirname "$0")/../realplan" "$@" || exit 2
steps=10 mb=8 reps=1 dir=runs/x from=1 seq="" new_data="" save=0 lr=3e-4
while [ $# -gt 0 ]; do
  case $1 in
    train.steps=*) steps=${1#*=} ;;
    train.micro_batches=*) mb=${1#*=} ;;
    parallel.replicas=*) reps=${1#*=} ;;
    train.out_dir=*) dir=${1#*=} ;;
    train.seq_len=*) seq=${1#*=} ;;
    train.save_every=*) save=${1#*=} ;;
    train.lr=*) lr=${1#*=} ;;
    --resume) from=$((${2##*_} + 1)); shift ;;
    --resume-new-data) new_data=1 ;;
  esac
  shift
done
case $dir in *"${FAKE_FAIL:-@}"*) echo "cpgen: made to fail"; exit 1 ;; esac
if [ "$from" -gt 1 ]; then # a resume: another sequence length only when asked for, and the notes a resume prints
  if [ -n "$seq" ] && [ -z "$new_data" ] && [ -z "${FAKE_TAKE_SEQ:-}" ]; then
    echo "cpgen: $dir: resuming would change which tokens come next: train.seq_len is $seq; or pass --resume-new-data"
    exit 1
  fi
  [ -z "$new_data" ] || echo "note: --resume-new-data: train.seq_len is 1024 (stand-in)"
  [ -n "${FAKE_NO_NOTE:-}" ] || echo "note: another layout than the checkpoint's run: (stand-in)"
fi
case $dir in *"${FAKE_CUT:-@}"*) steps=15 ;; esac
scale=1000 # per mille
case $dir in *"${FAKE_OFF:-@}"*) scale=1002 ;; esac
scale=$((scale + $(awk -v r="$lr" 'BEGIN { printf "%d", (r / 3e-4 - 1) * 150 }')))
mem=1000
case $dir in *"${FAKE_MEM:-@}"*) mem=1020 ;; esac
mkdir -p "$dir/ckpt_10"
[ "$save" -le 0 ] || { mkdir -p "$dir/ckpt_$save" && echo '{}' >"$dir/ckpt_$save/trainer_state.json"; }
: >"$dir/metrics.jsonl"
echo '<svg/>' >"$dir/report.svg"
for ((s = from; s <= steps; s++)); do
  u=$(((6300000 - 10000 * s + 1000 * mb * reps) * scale / 1000)) # the loss in millionths
  loss=$(printf '%d.%06d' $((u / 1000000)) $((u % 1000000)))
  echo "{\"step\":$s,\"loss\":$loss,\"norm\":1.5,\"seconds\":0.1,\"mem_measured\":$mem,\"mem_planned\":1000}" \
    >>"$dir/metrics.jsonl"
  # FAKE_VAL: a validation loss every 10 steps (the step's loss plus 0.5)
  [ -z "${FAKE_VAL:-}" ] || [ $((s % 10)) != 0 ] ||
    echo "{\"step\":$s,\"val_tokens\":1000,\"val_loss\":$(printf '%d.%06d' $(((u + 500000) / 1000000)) \
      $(((u + 500000) % 1000000)))}" >>"$dir/metrics.jsonl"
  echo "step $s/$steps | loss $loss"
done
echo "done: $steps steps"
SH
printf '#!/bin/sh
echo "1 of 1 cases agree"
' >"$tmp/sim/tests/gpu/test_parallel"
chmod +x "$tmp/sim/cpgen" "$tmp/sim/tests/gpu/test_parallel"
# script WANT WHAT GPUS SCRIPT [VAR=VALUE...]: the script on the stand-ins
script() {
  local want=$1 what=$2 n=$3 s=$4
  shift 4
  rm -rf "$tmp/simout"
  env PATH="$tmp/gpus:$PATH" FAKE_GPUS="$n" OUT="$tmp/simout" "$@" timeout 120 bash "$s" "$tmp/sim" >"$tmp/log" 2>&1
  expect_rc "$want" "$what" $? "$tmp/log" "${PAT:-}"
}
PAT="skipped +hybrid" script 77 "replicas, 2 GPUs: curve and resume agree, hybrid skipped" 2 \
  tools/gpu-replicas-check.sh
script 0 "replicas, 4 GPUs: every part agrees" 4 tools/gpu-replicas-check.sh
PAT="rep2g2/metrics.jsonl: steps 1-15" script 1 "replicas: the hybrid run cut short" 4 tools/gpu-replicas-check.sh \
  FAKE_CUT=rep2g2
script 1 "replicas: the resumed run over the bound" 2 tools/gpu-replicas-check.sh FAKE_OFF=rep2_resume
script 1 "replicas: a run fails" 2 tools/gpu-replicas-check.sh FAKE_FAIL=runs/rep2
script 0 "ring, 2 GPUs: grads, curve and resume" 2 tools/gpu-ring-check.sh PARTS="grads curve resume"
PAT="skipped +curve \(needs 2 GPUs" script 77 "ring, 1 GPU: skipped" 1 tools/gpu-ring-check.sh PARTS="curve resume"
script 1 "ring: resume without the curve" 2 tools/gpu-ring-check.sh PARTS="resume"
script 0 "parallel, 2 GPUs: grads, curve and resume" 2 tools/gpu-parallel-check.sh PARTS="grads curve resume"
PAT="curve2_host/metrics.jsonl: steps 1-15" script 1 "parallel: the host optimizer's run cut short" 2 \
  tools/gpu-parallel-check.sh PARTS="curve" FAKE_CUT=curve2_host
script 1 "parallel: a resumed run over the bound" 2 tools/gpu-parallel-check.sh PARTS="curve resume" FAKE_OFF=resume1
PAT="every part \(GPUS=2\) \(needs 2 GPUs, this machine has 1\)" script 77 "parallel, 1 GPU: skipped" 1 \
  tools/gpu-parallel-check.sh PARTS="curve"
script 1 "parallel: PARTS naming nothing" 2 tools/gpu-parallel-check.sh PARTS="curv"
PAT="9 of 9 cases passed" script 0 "relayout, 1 GPU: every resumed layout agrees" 1 tools/gpu-relayout-check.sh
PAT="ring2 .*FAILED: loss 2.00e-03" script 1 "relayout: a resumed layout over the bound" 1 \
  tools/gpu-relayout-check.sh FAKE_OFF=runs/ring2
PAT="FAILED +to_one_gpu: save_ulysses4 exited 1" script 1 "relayout: the reverse's saving run fails" 1 \
  tools/gpu-relayout-check.sh FAKE_FAIL=save_ulysses4
PAT="refuse_seq .*FAILED: exit 0, not a refusal" script 1 "relayout: another seq_len taken without asking" 1 \
  tools/gpu-relayout-check.sh FAKE_TAKE_SEQ=1
PAT="no note of the other layout" script 1 "relayout: a resume that does not say it changed layout" 1 \
  tools/gpu-relayout-check.sh FAKE_NO_NOTE=1
PAT="resumed steps \[11\]..\[15\]" script 1 "relayout: a resumed run cut short" 1 tools/gpu-relayout-check.sh \
  FAKE_CUT=runs/offload
# the real-text run on byte-level shards of this tree's tools (no `tokenizers` needed), checkpoints in the scratch
rt=(tools/gpu-real-text-run.sh TOKENIZER=byte-level INPUTS=tools CKPT_DIR="$tmp/ckpt")
PAT="loss: mean of the first 20 steps" script 0 "real text: the resumed run agrees, the loss falls" 1 "${rt[@]}"
# PACKAGES=1: python3's site folders join the inputs (up to MAX_BYTES), and the table says how often a token is read
PAT="data: 300 steps of 32K tokens read the training tokens [0-9]+\.[0-9]{2} times" script 0 \
  "real text: with the Python packages' sources" 1 "${rt[@]}" PACKAGES=1 MAX_BYTES=2000000
PAT="FAILED +resumed against uninterrupted" script 1 "real text: a resumed run over the bound" 1 "${rt[@]}" \
  FAKE_OFF=resumed
PAT="FAILED +full: exit status 1" script 1 "real text: the uninterrupted run fails" 1 "${rt[@]}" FAKE_FAIL=full
PAT="loss falls: FAILED" script 1 "real text: too few steps to see the loss fall" 1 "${rt[@]}" STEPS=30
# COMPARE=fp8: bf16 and fp8 side by side, judged by tools/precision_compare.py
PAT="^at the end: .*difference 0\.00% .*OK$" script 0 "real text, fp8 against bf16: alike" 1 "${rt[@]}" COMPARE=fp8 \
  FAKE_VAL=1
PAT="^  training loss: fp8 \+0\.00% against bf16 over the run, \+0\.00% over the last 100 steps" script 0 \
  "real text, fp8 against bf16: the training loss's gap in the table" 1 "${rt[@]}" COMPARE=fp8 FAKE_VAL=1
PAT="^  judged: against one bf16 run; an FP8 recipe is judged against bf16's band" script 0 \
  "real text, fp8 against bf16: one bf16 run's verdict says the band is the rule" 1 "${rt[@]}" COMPARE=fp8 FAKE_VAL=1
PAT="FAILED +fp8: exit status 1" script 1 "real text, fp8 against bf16: the fp8 run fails" 1 "${rt[@]}" \
  COMPARE=fp8 FAKE_VAL=1 FAKE_FAIL=fp8
PAT="fp8: FAILED: 15 training steps of 300" script 1 "real text, fp8 against bf16: the fp8 run cut short" 1 \
  "${rt[@]}" COMPARE=fp8 FAKE_VAL=1 FAKE_CUT=fp8
# COMPARE=nondeterministic: the same judge on a second bf16 run, its name in every line
PAT="^at the end: .*nondeterministic .*difference 0\.00% .*OK$" script 0 "real text, the noise floor: alike" 1 \
  "${rt[@]}" COMPARE=nondeterministic FAKE_VAL=1
PAT="nondeterministic: FAILED: 15 training steps of 300" script 1 "real text, the noise floor: cut short" 1 \
  "${rt[@]}" COMPARE=nondeterministic FAKE_VAL=1 FAKE_CUT=nondeterministic
PAT="fp8 and nondeterministic are known" script 2 "real text: an unknown COMPARE" 1 "${rt[@]}" COMPARE=fp16
# SECOND_SETS: settings of the second run, which the planner checks (the stand-in plans with the real cpgen first)
PAT="^at the end: .*difference 0\.00% .*OK$" script 0 "real text, an fp8 recipe against bf16: alike" 1 "${rt[@]}" \
  COMPARE=fp8 FAKE_VAL=1 SECOND_SETS=train.fp8_weight_grads=bf16
PAT="FAILED +fp8: exit status 2" script 1 "real text, an fp8 recipe the planner refuses" 1 "${rt[@]}" COMPARE=fp8 \
  FAKE_VAL=1 SECOND_SETS=train.fp8_weight_grads=half
PAT="set COMPARE too" script 2 "real text: SECOND_SETS without a comparison" 1 "${rt[@]}" \
  SECOND_SETS=train.fp8_weight_grads=bf16
# ORACLE=1: both runs save their last step and one forward evaluates both sets of weights; a stand-in for
# tools/hf_val_loss.py gives each checkpoint its run's last validation loss over its run's targets, FAKE_ORACLE_OFF=NAME
# 1% more for the checkpoints of NAME, FAKE_ORACLE_TARGETS=NAME one target fewer; without a checkpoint it fails
cat >"$tmp/oracle" <<'PY'
import json, os, sys
ck = sys.argv[1]
if not os.path.isdir(ck):
    sys.exit(f"stand-in oracle: no checkpoint {ck}")
rows = [json.loads(l) for l in open(os.path.join(os.path.dirname(ck), "metrics.jsonl"))]
last = [r for r in rows if "val_loss" in r][-1]
f = 1.01 if os.environ.get("FAKE_ORACLE_OFF", "@") in ck else 1.0
n = last["val_tokens"] - (os.environ.get("FAKE_ORACLE_TARGETS", "@") in ck)
for d in sys.argv[5:]:
    print(json.dumps({"dtype": d, "loss": last["val_loss"] * f, "targets": n}))
PY
ort=("${rt[@]}" COMPARE=fp8 FAKE_VAL=1 ORACLE=1 HF_VAL_LOSS="$tmp/oracle")
PAT="^  one forward, fp32: bf16's weights [0-9.]+, fp8's [0-9.]+, fp8 \+0\.00% against bf16$" script 0 \
  "real text, one forward for both runs' weights: alike" 1 "${ort[@]}"
PAT="bf16's own validation loss .* 1\.0e-02 apart \(bound 1e-03\) FAILED" script 1 \
  "real text, one forward: it does not compute what cpgen computes" 1 "${ort[@]}" FAKE_ORACLE_OFF=ckpt/full/
PAT="one forward, fp32: .*fp8 \+1\.00% against bf16" script 0 \
  "real text, one forward: the fp8 run's weights 1% worse are reported" 1 "${ort[@]}" FAKE_ORACLE_OFF=ckpt/fp8/
PAT="fp8: transformers' bf16 forward scored 999 targets, the run's evaluation 1000" script 1 \
  "real text, one forward: not the sequences cpgen evaluated" 1 "${ort[@]}" FAKE_ORACLE_TARGETS=ckpt/fp8/
PAT="FAILED +oracle_fp8: exit status 1" script 1 "real text, one forward: a run failed and saved nothing" 1 \
  "${ort[@]}" FAKE_FAIL=ckpt/fp8
PAT="set COMPARE too" script 2 "real text: ORACLE without a comparison" 1 "${rt[@]}" ORACLE=1
# LR_BAND=PCT: bf16 at the rate PCT% either side joins the first run as bf16's band, which judges the second run
PAT="^  at the end: .*band [0-9.]+ \(lr_low\) to [0-9.]+ \(lr_high\), fp8 [0-9.]+, inside it .*OK$" script 0 \
  "real text, fp8 against bf16's band: a second run at its highest rate" 1 "${rt[@]}" COMPARE=fp8 FAKE_VAL=1 \
  LR_BAND=10 SECOND_SETS=train.lr=3.3e-4
PAT="^  against bf16 alone \(unjudged\): fp8 1\.30% above" script 0 \
  "real text, fp8 against bf16's band: the distance from bf16 alone printed" 1 "${rt[@]}" COMPARE=fp8 FAKE_VAL=1 \
  LR_BAND=10 SECOND_SETS=train.lr=3.3e-4
PAT="^  at the end: .*fp8 [0-9.]+, [0-9.]+% above its highest .*FAILED$" script 1 \
  "real text, fp8 against bf16's band: above the band" 1 "${rt[@]}" COMPARE=fp8 FAKE_VAL=1 LR_BAND=1 \
  SECOND_SETS=train.lr=3.3e-4
PAT="FAILED +lr_high: exit status 1" script 1 "real text, fp8 against bf16's band: a band's run fails" 1 \
  "${rt[@]}" COMPARE=fp8 FAKE_VAL=1 LR_BAND=10 FAKE_FAIL=lr_high
PAT="set COMPARE too" script 2 "real text: LR_BAND without a comparison" 1 "${rt[@]}" LR_BAND=10
# BAND_ONLY=1 trains the band alone and leaves its metrics and band.key; BAND_FROM takes them when the key is this
# call's (the build, shards and settings), and runs nothing when it is not
bd=("${rt[@]}" COMPARE=fp8 FAKE_VAL=1 LR_BAND=10)
PAT="^band only: metrics_lr_low.jsonl, metrics_lr_high.jsonl and band.key" script 0 "real text: the band alone" 1 \
  "${bd[@]}" BAND_ONLY=1
rm -rf "$tmp/band" && cp -r "$tmp/simout/real-text" "$tmp/band"
PAT="^  at the end: .*band [0-9.]+ \(lr_low\) to [0-9.]+ \(lr_high\), fp8 [0-9.]+, inside it .*OK$" script 0 \
  "real text: the band from an earlier call" 1 "${bd[@]}" BAND_FROM="$tmp/band" SECOND_SETS=train.lr=3.3e-4
PAT="FAILED: band: .* ran with another build, data or settings .*nothing run" script 1 \
  "real text: a band from another start" 1 "${bd[@]}" BAND_FROM="$tmp/band" SETS=init.seed=2
PAT="FAILED: band: .* ran with another build, data or settings" script 1 \
  "real text: a band of another width" 1 "${rt[@]}" COMPARE=fp8 FAKE_VAL=1 LR_BAND=5 BAND_FROM="$tmp/band"
PAT="set LR_BAND too" script 2 "real text: BAND_FROM without LR_BAND" 1 "${rt[@]}" COMPARE=fp8 BAND_FROM="$tmp/band"
PAT="a folder a BAND_ONLY=1 call left" script 2 "real text: BAND_FROM a folder without band.key" 1 "${bd[@]}" \
  BAND_FROM="$tmp"
PAT="not with BAND_ONLY" script 2 "real text: ORACLE with BAND_ONLY" 1 "${bd[@]}" BAND_ONLY=1 ORACLE=1
PAT="a percentage between 0 and 100" script 2 "real text: LR_BAND not a percentage" 1 "${rt[@]}" COMPARE=fp8 \
  LR_BAND=ten
PAT="set the learning rate with LR=" script 2 "real text: the rate in SETS" 1 "${rt[@]}" SETS=train.lr=1e-4
# gpu-fp8-bench.sh: bf16 and each recipe, every run planned (with the real cpgen) and judged by its own metrics
PAT="^fp8_tensor +0.10 s +0.100 s +1.000 +0.00%" script 0 "fp8 bench: every recipe, each within its plan" 1 \
  tools/gpu-fp8-bench.sh STEPS=3 EXTRA=parallel.mlp_tile=8K
PAT="FAILED +fp8_wgrad: exit status 1" script 1 "fp8 bench: a recipe's run fails" 1 tools/gpu-fp8-bench.sh \
  STEPS=3 FAKE_FAIL=runs/fp8_wgrad
PAT="FAILED: fp8: steps \[1, .*15\], not each of 1-3 once" script 1 "fp8 bench: a run goes on past its steps" 1 \
  tools/gpu-fp8-bench.sh STEPS=3 RECIPES=fp8 FAKE_CUT=runs/fp8
PAT="FAILED: fp8_tensor: GPU memory 2.00% from its plan" script 1 "fp8 bench: a run over its planned memory" 1 \
  tools/gpu-fp8-bench.sh STEPS=3 FAKE_MEM=runs/fp8_tensor
PAT="FAILED +half: exit status 2" script 1 "fp8 bench: a recipe the planner refuses" 1 tools/gpu-fp8-bench.sh \
  STEPS=3 RECIPES="fp8 half:train.fp8_weight_grads=half"
PAT="give 2 or more" script 2 "fp8 bench: one step, nothing to measure after the warm-up" 1 tools/gpu-fp8-bench.sh \
  STEPS=1

# gpu-eval-check.sh on a stand-in cpgen that evaluates: its losses a function of the step (and, with lr = 0, nearly
# flat), an evaluation after the steps train.eval_every says with val_tokens of every group, step 1's loss where lr
# = 0. FAKE_OFF=NAME moves the losses of runs whose out_dir holds NAME by 1e-6 (an evaluation that leaked into
# training), FAKE_VALOFF=NAME the val_loss by 1e-4, FAKE_NOEVAL=NAME logs no val_loss, FAKE_FAIL=NAME exits 1; the
# stand-in test_validation exits FAKE_UNIT (0, 1, or 77 saying skipped).
mkdir -p "$tmp/evalsim/tests/gpu"
cat >"$tmp/evalsim/cpgen" <<'SH'
#!/usr/bin/env bash
set -u
[ "${1:-}" = run ] || { echo "stand-in cpgen: $*"; exit 0; }
"$(dirname "$0")/../realplan" "$@" || exit 2
steps=10 mb=8 reps=1 dir=runs/x every=0 lr=1 val=0
while [ $# -gt 0 ]; do
  case $1 in
    train.steps=*) steps=${1#*=} ;;
    train.micro_batches=*) mb=${1#*=} ;;
    parallel.replicas=*) reps=${1#*=} ;;
    train.out_dir=*) dir=${1#*=} ;;
    train.eval_every=*) every=${1#*=} ;;
    train.lr=*) lr=${1#*=} ;;
    data.val=*) val=1 ;;
  esac
  shift
done
case $dir in *"${FAKE_FAIL:-@}"*) echo "cpgen: made to fail"; exit 1 ;; esac
mkdir -p "$dir"
: >"$dir/metrics.jsonl"
python3 - "$dir" "$steps" "$mb" "$reps" "$every" "$lr" "$val" <<'PY'
import os, sys
d, steps, mb, reps, every, lr, val = sys.argv[1], *map(int, sys.argv[2:5]), int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
off = 1e-6 if os.environ.get("FAKE_OFF", "@") in d else 0
voff = 1e-4 if os.environ.get("FAKE_VALOFF", "@") in d else 0
noeval = os.environ.get("FAKE_NOEVAL", "@") in d
loss = lambda s: (6.3 - 0.01 * s if lr else 6.3 + 1e-3 * (s % 3)) + off
last = None
with open(f"{d}/metrics.jsonl", "w") as m:
    for s in range(1, steps + 1):
        v = ""
        line = f'{{"step":{s},"loss":{loss(s):.9g},"norm":{1.5 + 0.01 * s:.9g},'
        if val and every and (s % every == 0 or s == steps) and not noeval:
            last = (loss(1) if not lr else loss(s) - 0.05) + voff
            line += f'"val_loss":{last:.9g},"val_tokens":{mb * reps * 2048},"val_seconds":0.01,'
            v = f" | val loss {last:.4f}"
        m.write(line + '"skipped":false}\n')
        print(f"step {s}/{steps} | loss {loss(s):.4f}{v} | norm 1.5")
print(f"done: {steps} steps | loss 6.3 -> 6.2" + (f" | val loss {last:.4f} (after step {steps})" if last else ""))
PY
SH
printf '#!/bin/sh\n[ "${FAKE_UNIT:-0}" = 77 ] && echo "test_validation: skipped: no GPU (stand-in)"\nexit "${FAKE_UNIT:-0}"\n' \
  >"$tmp/evalsim/tests/gpu/test_validation"
chmod +x "$tmp/evalsim/cpgen" "$tmp/evalsim/tests/gpu/test_validation"
evalcheck() { # WANT WHAT [VAR=VALUE...]
  local want=$1 what=$2
  shift 2
  rm -rf "$tmp/simout"
  env PATH="$tmp/gpus:$PATH" FAKE_GPUS=1 OUT="$tmp/simout" "$@" timeout 120 bash tools/gpu-eval-check.sh \
    "$tmp/evalsim" >"$tmp/log" 2>&1
  expect_rc "$want" "eval: $what" $? "$tmp/log" "${PAT:-}"
}
PAT="^5 passed, 0 failed, 0 skipped" evalcheck 0 "every layout: training as without, val_loss as step 1's"
PAT="one +0/6 .*FAILED: A and B differ at steps \[1, " evalcheck 1 "an evaluation that moves training by 1e-6" \
  FAKE_OFF=one_A
PAT="ring2 .*C: val_loss 1.59e-05 from step 1's loss" evalcheck 1 "val_loss 1e-4 off step 1's, lr = 0" \
  FAKE_VALOFF=ring2_C
PAT="replicas2 .*A: 0 evaluations of 6" evalcheck 1 "a run that did not evaluate" FAKE_NOEVAL=replicas2_A
PAT="ulysses2_B exited 1" evalcheck 1 "a run that failed" FAKE_FAIL=ulysses2_B
PAT="test_validation .*FAILED: exit 1" evalcheck 1 "the GPU test failed" FAKE_UNIT=1
PAT="^4 passed, 0 failed, 1 skipped" evalcheck 77 "the GPU test skipped" FAKE_UNIT=77

# gpu-ckpt-check.sh on a stand-in cpgen of its own (in $tmp/ckptsim): llama1b runs log 30 steps with saves at 10,
# 20 and 30 (asynchronous ones holding the loop 2 ms of a 1 s step, waiting ones 9 s) and leave the same ckpt_30; a
# tiny run with CPGEN_CKPT_PAUSE says the writer pauses in ckpt_20 and sleeps, with ckpt_10, `latest` and the .tmp
# folder there; a resumed run starts from ckpt_10 (or the step of --resume DIR/ckpt_N) with the same losses; a run
# of 4 ranks starts 4 sleeping children and, when one is killed, stops after the step it is at with every rank's
# line and exit 75. FAKE_STALL=1: an asynchronous save holds 10%; FAKE_DIFF=1: the waiting run's ckpt_30 differs;
# FAKE_OFF=1: resumed runs have losses 1e-3 off; FAKE_SPLIT=1: one rank stops a step later.
mkdir -p "$tmp/ckptsim"
cat >"$tmp/ckptsim/cpgen" <<'SH'
#!/usr/bin/env bash
set -u
[ "${1:-}" = run ] || { echo "stand-in cpgen: $*"; exit 0; }
"$(dirname "$0")/../realplan" "$@" || exit 2
spec=$2 dir=runs/x steps=30 every=10 async=1 from=1 ranks=1
shift 2
while [ $# -gt 0 ]; do
  case $1 in
    train.steps=*) steps=${1#*=} ;;
    train.save_every=*) every=${1#*=} ;;
    train.out_dir=*) dir=${1#*=} ;;
    train.async_save=false) async=0 ;;
    --ranks-per-gpu) ranks=$2; shift ;;
    --resume) from=11; [ -f "$dir/latest" ] && from=$(($(sed 's/ckpt_//' "$dir/latest") + 1)); shift ;;
  esac
  shift
done
mkdir -p "$dir"
off=0
[ "$from" -gt 1 ] && [ -n "${FAKE_OFF:-}" ] && off=1
loss() { awk -v s="$1" -v o="$off" 'BEGIN { printf "%.9f", 6 - 0.01 * s + o * 0.001 * (6 - 0.01 * s) }'; }
save() { # STEP: a complete checkpoint and latest
  mkdir -p "$dir/ckpt_$1"
  printf 'weights %s %s\n' "$spec" "$1" >"$dir/ckpt_$1/model.safetensors"
  [ "$async" = 0 ] && [ -n "${FAKE_DIFF:-}" ] && echo x >>"$dir/ckpt_$1/model.safetensors"
  echo "{\"step\": $1}" >"$dir/ckpt_$1/trainer_state.json"
  echo "ckpt_$1" >"$dir/latest"
}
[ "$from" = 1 ] && : >"$dir/metrics.jsonl"
[ "$from" -gt 1 ] && { echo "resumed from $dir/ckpt_$((from - 1)) (cpgen 0.1.0, spec $spec) in 0.1 s"; rm -rf "$dir"/ckpt_*.tmp.*; }
kids=()
# the ranks: children whose command line says "run", as cpgen's ranks' does
if [ "$ranks" -gt 1 ]; then for r in $(seq 1 "$ranks"); do (exec -a "cpgen run rank $r" sleep 1000) & kids+=($!); done; fi
for ((s = from; s <= steps; s++)); do
  extra=""
  if [ "$spec" = llama1b ] && [ $((s % every)) = 0 ]; then
    held=0.002
    [ -n "${FAKE_STALL:-}" ] && held=0.1
    [ "$async" = 0 ] && held=9.0
    extra="\"ckpt\":$s,\"ckpt_held\":$held,\"ckpt_waited\":0,"
    save "$s"
    echo "ckpt_$s written: 13.81 GiB in 5.1 s, 2.91 GB/s ($dir/ckpt_$s)"
  fi
  echo "{\"step\":$s,\"loss\":$(loss "$s"),\"norm\":1.5,\"seconds\":1.0,${extra}\"skipped\":false}" >>"$dir/metrics.jsonl"
  echo "step $s/$steps | loss $(loss "$s")"
  if [ "$spec" = tiny ] && [ "$ranks" = 1 ] && [ $((s % every)) = 0 ]; then
    if [ "$s" = 20 ] && [ -n "${CPGEN_CKPT_PAUSE:-}" ]; then
      mkdir -p "$dir/ckpt_20.tmp.$$"
      echo "cpgen: CPGEN_CKPT_PAUSE: the writer pauses 120 s after the weights of ckpt_20 (in $dir/ckpt_20.tmp.$$)" >&2
      exec sleep 120
    fi
    save "$s"
  fi
  if [ "$ranks" -gt 1 ]; then
    sleep 0.2
    for k in "${kids[@]}"; do
      kill -0 "$k" 2>/dev/null && continue
      save "$s"
      echo "stopped by SIGTERM after step $s: saved ckpt_$s; continue with --resume $dir"
      for r in $(seq 0 $((ranks - 1))); do
        echo "cpgen: rank $r: stopped in order after step $((s + (r == 3 && ${FAKE_SPLIT:-0})))" >&2
      done
      kill "${kids[@]}" 2>/dev/null
      echo "stopped by SIGTERM (signal 15): $ranks of $ranks ranks stopped in order (exit 75)"
      exit 75
    done
  fi
done
[ "$ranks" -gt 1 ] && kill "${kids[@]}" 2>/dev/null
echo "done: $steps steps"
SH
chmod +x "$tmp/ckptsim/cpgen"
ckpt() { # WANT WHAT [VAR=VALUE...]: gpu-ckpt-check.sh on its stand-in
  local want=$1 what=$2
  shift 2
  rm -rf "$tmp/simout"
  env PATH="$tmp/gpus:$PATH" FAKE_GPUS=1 OUT="$tmp/simout" CKPT_DISK_GB=0 "$@" timeout 120 \
    bash tools/gpu-ckpt-check.sh "$tmp/ckptsim" >"$tmp/log" 2>&1
  expect_rc "$want" "$what" $? "$tmp/log" "${PAT:-}"
}
PAT="^stop +resumed losses" ckpt 0 "ckpt: stall, kill and stop pass on the stand-in"
PAT="ckpt_20 held the loop .*FAILED" ckpt 1 "ckpt: an asynchronous save holding the loop 10% of a step" FAKE_STALL=1
PAT="ckpt_30 async = sync \(cmp\).*FAILED" ckpt 1 "ckpt: the waiting run's checkpoint differs" FAKE_DIFF=1
PAT="kill +resumed losses 11-30.*FAILED" ckpt 1 "ckpt: the resumed run's losses off" FAKE_OFF=1
PAT="stop +SIGTERM to one rank.*FAILED" ckpt 1 "ckpt: a rank stops a step later" FAKE_SPLIT=1 PARTS=stop

# hf_check.sh: its plans from the real cpgen (a link in a stand-in build), test_train_tiny a stand-in that gives the
# real `cpgen plan` its overrides (as the test's own run would load them) and writes 20 steps of metrics, Python a
# stand-in (HF_PYTHON) whose make_model.py does nothing and whose hf_compare.py matches, or misses for the cases
# whose folder holds FAKE_MISMATCH
mkdir -p "$tmp/hfsim/tests/gpu"
ln -s "$REAL_CPGEN" "$tmp/hfsim/cpgen"
cat >"$tmp/hfsim/tests/gpu/test_train_tiny" <<'SH'
#!/usr/bin/env bash
set -u
sets=(--set train.steps="$CPGEN_HF_STEPS" --set train.warmup=5 --set train.out_dir="$CPGEN_HF_DIR")
for s in $CPGEN_HF_SETS; do sets+=(--set "$s"); done
"$REAL_CPGEN" plan "$CPGEN_HF_SPEC" "${sets[@]}" >/dev/null || exit 1
for ((i = 1; i <= CPGEN_HF_STEPS; i++)); do echo "{\"step\":$i,\"loss\":6.2,\"norm\":1.5}"; done >"$CPGEN_HF_DIR/metrics.jsonl"
SH
cat >"$tmp/hfsim/python" <<'SH'
#!/usr/bin/env bash
case $1 in
  tests/hf/make_model.py) exit 0 ;;
  tests/gpu/hf_compare.py)
    echo "step 1 against fp32: loss 1.00e-05 (bound 1e-3) (stand-in)"
    [ -n "${FAKE_UNPACKED:-}" ] || echo "documents alone against packed (stand-in)"
    case $2 in *"${FAKE_MISMATCH:-@}") echo MISMATCH; exit 1 ;; esac
    echo MATCH ;;
  *) echo "stand-in python: $*"; exit 2 ;;
esac
SH
chmod +x "$tmp/hfsim/tests/gpu/test_train_tiny" "$tmp/hfsim/python"
hfcheck() { # WANT WHAT [VAR=VALUE...] [-- CASE...]
  local want=$1 what=$2 cases=()
  shift 2
  local vars=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -eq 0 ] || { shift; cases=("$@"); }
  rm -rf "$tmp/simout" "$tmp/hf"
  env PATH="$tmp/gpus:$PATH" FAKE_GPUS=1 OUT="$tmp/simout" HF_WORK="$tmp/hf" HF_PYTHON="$tmp/hfsim/python" \
    ${vars[@]+"${vars[@]}"} timeout 120 bash tests/gpu/hf_check.sh "$tmp/hfsim" ${cases[@]+"${cases[@]}"} >"$tmp/log" 2>&1
  expect_rc "$want" "hf_check: $what" $? "$tmp/log" "${PAT:-}"
}
PAT="== l8b_packed \(llama8b .*data.source=synthetic:packed\): MATCH" hfcheck 0 "every case's command line, all matching"
PAT="FAILED +packed.compare: exit status 1" hfcheck 1 "a packed case's comparison misses" FAKE_MISMATCH=/packed
PAT="FAILED: packed.compare: not compared as packed documents" hfcheck 1 "a packed case compared as one document" \
  FAKE_UNPACKED=1 -- packed
PAT="FAILED: unknown case pakced" hfcheck 1 "a case it does not know" -- tiny pakced
PAT="FAILED: tiny: cpgen plan failed" hfcheck 1 "an override cpgen refuses" HF_SETS=data.source=synthetic:pakked -- tiny

# gpu-docs-bench.sh on stand-ins: bench_attention prints its "DOCS" lines for the --docs length (exit 1 for the
# length FAKE_BENCH_FAIL), the peer (DOCS_PYTHON) its "FLEX" lines for each length but FAKE_FLEX_DROP (exit 1 with
# FAKE_FLEX_FAIL)
mkdir -p "$tmp/docsim/tests/gpu"
cat >"$tmp/docsim/tests/gpu/bench_attention" <<'SH'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --docs ] && len=$2; shift; done
[ "$len" = "${FAKE_BENCH_FAIL:-@}" ] && { echo "bench_attention: made to fail"; exit 1; }
echo "DOCS 32 32 $len 10.0 25.0"
echo "DOCS 32 8 $len 9.0 22.0"
SH
cat >"$tmp/docsim/python" <<'SH'
#!/usr/bin/env bash
[ -n "${FAKE_FLEX_FAIL:-}" ] && { echo "FAILED: no FlexAttention (stand-in)"; exit 1; }
while [ $# -gt 0 ]; do [ "$1" = --docs ] && lens=$2; shift; done
for l in ${lens//,/ }; do
  [ "$l" = "${FAKE_FLEX_DROP:-@}" ] || printf 'FLEX 32 32 %s 20.0 50.0\nFLEX 32 8 %s 18.0 44.0\n' "$l" "$l"
done
SH
# and cpgen: plan gives the vocabulary and a predicted step (6 s masked, 23 s not), run a median step (6.1 s masked,
# 24.4 s not; exit 1 for the mode FAKE_STEP_FAIL)
cat >"$tmp/docsim/cpgen" <<'SH'
#!/usr/bin/env bash
cmd=$1 mode=
for a; do
  [ "$a" = --json ] && { echo '{"model": {"vocab": 1000}}'; exit 0; }
  case $a in data.documents=*) mode=${a#*=} ;; esac
done
if [ "$cmd" = plan ]; then
  [ "$mode" = mask ] && echo "predicted step: 6.00 s = compute 6.00 s" || echo "predicted step: 23.00 s = compute 23.00 s"
else
  [ "$mode" = "${FAKE_STEP_FAIL:-@}" ] && { echo "cpgen: made to fail"; exit 1; }
  [ "$mode" = mask ] && w="6.3% of causal" t="6.10 s" || w="100.0% of causal" t="24.40 s"
  echo "step 2/2 | loss 9.0 | attention $w (6.2% kept) | mem 1/1 GiB"
  echo "done: 2 steps | loss 9.1 -> 9.0 | median step $t, 10 tok/s/GPU"
fi
SH
chmod +x "$tmp/docsim/tests/gpu/bench_attention" "$tmp/docsim/python" "$tmp/docsim/cpgen"
docsbench() { # WANT WHAT [VAR=VALUE...]
  local want=$1 what=$2
  shift 2
  rm -rf "$tmp/simout"
  env PATH="$tmp/gpus:$PATH" FAKE_GPUS=1 OUT="$tmp/simout" DOCS_PYTHON="$tmp/docsim/python" SEQ=65536 STEP_STEPS=0 "$@" \
    timeout 60 bash tools/gpu-docs-bench.sh "$tmp/docsim" >"$tmp/log" 2>&1
  expect_rc "$want" "docs bench: $what" $? "$tmp/log" "${PAT:-}"
}
PAT="^ +32768 +50\.00% GQA 32/8 +\| +9\.000 +22\.000 .*\| +2\.00 +2\.00$" docsbench 0 "every length, both, the ratio"
PAT="FAILED +cpgen_8192: exit status 1" docsbench 1 "bench_attention fails at one length" FAKE_BENCH_FAIL=8192
PAT="FAILED: no times for MHA 32/32 at 4096: FlexAttention" docsbench 1 "the peer fails" FAKE_FLEX_FAIL=1
PAT="FAILED: no times for GQA 32/8 at 32768: FlexAttention" docsbench 1 "the peer leaves out a length" \
  FAKE_FLEX_DROP=32768
PAT="^masked step 4\.00x faster than unmasked" docsbench 0 "the step, masked and not" STEP_STEPS=2
PAT="FAILED +step_stream: exit status 1" docsbench 1 "the unmasked step fails" STEP_STEPS=2 FAKE_STEP_FAIL=stream

# gpu-attention-profile.sh on stand-ins: ncu (on PATH) lists the wgmma pipe's metric alone in --query-metrics and
# refuses any other in --metrics, as the real one refuses a name it does not know; a profile run checks its filter
# options, runs the bench after -o and writes REP.ncu-rep naming the direction (none, with ncu's warning, for the
# direction FAKE_NCU_NONE); --import prints the details, or with --csv a made-up raw page: the forward 20 ms in
# nsecond with thousands separators, the backward 50 ms in msecond, PC-sampling stalls (whose _not_issued twins and
# 'selected' are not stalls); FAKE_NCU_NA names the tensor metric as no candidate. bench_attention checks it got
# --only and --reps 1 and exits 1 for --only FAKE_BENCH_FAIL.
mkdir -p "$tmp/profsim/bin" "$tmp/profsim/build/tests/gpu"
cat >"$tmp/profsim/bin/ncu" <<'SH'
#!/usr/bin/env bash
set -u
gmma=sm__pipe_tensor_op_gmma_cycles_active
case ${1:-} in
  --version) echo "Version 2099.1 (stand-in)"; exit 0 ;;
  --query-metrics)
    printf 'Metric Name  Metric Description\n%s  # of cycles the wgmma pipe was active\n' "$gmma"
    exit 0 ;;
  --import)
    rep=$2 dir=$(cat "$2")
    [[ " $* " == *" --csv "* ]] || { echo "details of $rep: Section: GPU Speed Of Light Throughput"; exit 0; }
    python3 - "$dir" "$gmma" <<'PY'
import csv, os, sys
d, gmma = sys.argv[1:]
tensor = "sm__pipe_fma_cycles_active" if os.environ.get("FAKE_NCU_NA") else gmma
fwd = d == "fwd"
cols = [("ID", "", "0"), ("Process ID", "", "1"), ("Kernel Name", "", f"attention_{d}_sm90_d128_q32_kv8_s32768"),
        ("Block Size", "", "(384, 1, 1)"), ("CC", "", "9.0"),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "81.5" if fwd else "77.0"),
        (f"{tensor}.avg.pct_of_peak_sustained_active", "%", "72.25" if fwd else "64.5"),
        ("launch__registers_per_thread", "register/thread", "168" if fwd else "240"),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", "18.7" if fwd else "12.5")]
if fwd:
    s = "smsp__average_warps_issue_stalled_"
    cols += [("gpu__time_duration.sum", "nsecond", "20,000,000"),
             ("launch__shared_mem_per_block_static", "byte", "1,024"),
             ("launch__shared_mem_per_block_dynamic", "byte", "231,424")]
    cols += [(f"{s}{r}_per_issue_active.ratio", "ratio", v) for r, v in
             (("barrier", "0.95"), ("long_scoreboard", "0.40"), ("selected", "2.50"), ("wait", "0.61"))]
else:
    s = "smsp__pcsamp_warps_issue_stalled_"
    cols += [("gpu__time_duration.sum", "msecond", "50"), ("launch__shared_mem_per_block_dynamic", "Kbyte", "200")]
    cols += [(f"{s}{r}", "", v) for r, v in (("barrier", "12,345"), ("barrier_not_issued", "99,999"),
             ("long_scoreboard", "2,000"), ("selected", "50,000"), ("wait", "7,000"), ("mio_throttle", "100"))]
w = csv.writer(sys.stdout, quoting=csv.QUOTE_ALL, lineterminator="\n")
for i in range(3):
    w.writerow([c[i] for c in cols])
PY
    exit 0 ;;
esac
want="--clock-control none --kernel-name regex:\^attention_(fwd|bwd)_\(sm90_\)\?d\[0-9\] "
if ! [[ "$*" =~ $want"--launch-skip 2 --launch-count 1 " ]]; then
  echo "==ERROR== stand-in ncu: not the options asked for: $*"
  exit 1
fi
dir=${BASH_REMATCH[1]}
while [ $# -gt 0 ]; do
  case $1 in
    --metrics) for m in ${2//,/ }; do
        [[ $m == "$gmma".* ]] || { echo "==ERROR== Failed to find metric $m"; exit 1; }
      done; shift ;;
    -o) o=$2; shift 2; break ;;
  esac
  shift
done
"$@" || exit $?
[ "$dir" = "${FAKE_NCU_NONE:-@}" ] && { echo "==WARNING== No kernels were profiled."; exit 0; }
echo "$dir" >"$o.ncu-rep"
SH
cat >"$tmp/profsim/build/tests/gpu/bench_attention" <<'SH'
#!/usr/bin/env bash
[[ " $* " == *" --reps 1 "* && " $* " =~ " --only "(fwd|bwd)" " ]] || { echo "stand-in bench: $*"; exit 2; }
[ "${BASH_REMATCH[1]}" = "${FAKE_BENCH_FAIL:-@}" ] && { echo "bench_attention: made to fail"; exit 1; }
echo "  GQA 32/8 ${BASH_REMATCH[1]} (wgmma): median 1.000 ms"
SH
chmod +x "$tmp/profsim/bin/ncu" "$tmp/profsim/build/tests/gpu/bench_attention"
profile() { # WANT WHAT [VAR=VALUE...]
  local want=$1 what=$2
  shift 2
  rm -rf "$tmp/simout"
  env PATH="$tmp/profsim/bin:$tmp/gpus:$PATH" FAKE_GPUS=1 LOGDIR="$tmp/simout/prof" "$@" timeout 60 \
    bash tools/gpu-attention-profile.sh "$tmp/profsim/build" >"$tmp/log" 2>&1
  expect_rc "$want" "attention profile: $what" $? "$tmp/log" "${PAT:-}"
}
PAT="^fwd +20\.000 +439\.8 +81\.5 +72\.2 +168 +18\.7 +227\.0  barrier 0\.95, wait 0\.61, long_scoreboard 0\.4$" \
  profile 0 "the forward's row: every figure, stalls without 'selected'"
PAT="^bwd +50\.000 +439\.8 +77\.0 +64\.5 +240 +12\.5 +195\.3  barrier 12345, wait 7000, long_scoreboard 2000$" \
  profile 0 "the backward's row: msecond, Kbyte, PC samples without _not_issued"
PAT="^fwd +20\.000 +439\.8 +81\.5 +n/a +168 " profile 0 "no tensor metric among the candidates: n/a" FAKE_NCU_NA=1
PAT="FAILED: bwd: .*No kernels were profiled" profile 1 "ncu profiled no backward launch" FAKE_NCU_NONE=bwd
PAT="FAILED +fwd: exit status 1" profile 1 "the bench fails under ncu" FAKE_BENCH_FAIL=fwd
PAT="skipped +no ncu \(NCU=" profile 77 "no ncu" NCU="$tmp/none"

# tools/precision_compare.py on made-up metrics: fp8 a little off bf16 passes; fp8 worse by more than 3% on the way,
# or 1% at the end (either side), or a step short, fails; fp8 better by more than 3% is not divergence
pc() { # WANT WHAT PATTERN TRAIN_FACTOR VAL_END_FACTOR [STEPS_OF_FP8 [BAND_VAL_END_FACTOR]]
  python3 - "$tmp/pc" "$4" "$5" "${6:-300}" "${7:-1}" <<'PY'
import json, math, sys
d, f, fe, n, be = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
for name, tf, ve, steps in (("bf16", 1.0, 1.0, 300), ("fp8", f, fe, n), ("band", be, be, 300)):
    with open(f"{d}_{name}.jsonl", "w") as o:
        for s in range(1, steps + 1):
            loss = 8 - 3 * math.log(s) / math.log(300)
            o.write(json.dumps({"step": s, "loss": loss * (tf if 101 <= s <= 120 else 1.002)}) + "\n")
            if s % 30 == 0:
                o.write(json.dumps({"step": s, "val_loss": (loss + 0.5) * (ve if s == 300 else 1.0)}) + "\n")
PY
  python3 tools/precision_compare.py "$tmp/pc_bf16.jsonl" "$tmp/pc_fp8.jsonl" 300 "$tmp/pc.svg" \
    ${7:+"fp8 and bf16's band"} ${7:+fp8} ${7:+--band} ${7:+"lr_low=$tmp/pc_band.jsonl"} >"$tmp/log" 2>&1
  expect_rc "$1" "precision_compare: $2" $? "$tmp/log" "$3"
}
pc 0 "fp8 0.2% off" "^at the end: .*difference 0\.20% above bf16 .*OK$" 1.0 1.002
pc 0 "fp8 5% better for 20 steps" "^on the way: .* OK; at most 5\.00% below" 0.95 1.0
pc 1 "fp8 5% worse for 20 steps" "^on the way: fp8 at most 5\.00% above .*FAILED" 1.05 1.0
pc 1 "fp8 2% worse at the end" "^at the end: .*difference 2\.00% above bf16 .*FAILED$" 1.0 1.02
pc 1 "fp8 2% better at the end (either side)" "^at the end: .*difference 2\.00% below bf16 .*FAILED$" 1.0 0.98
pc 1 "fp8 a step short" "^fp8: FAILED: 299 training steps of 300" 1.0 1.0 299
# --band: fp8 judged against the band of bf16 and its neighbours, from 1% below its lowest to 1% above its highest, and
# on the way against its highest (the band's run takes BAND_VAL_END_FACTOR at the end and over steps 101-120)
pc 0 "fp8 2% below bf16, inside the band" \
  "^at the end: .*band [0-9.]+ \(lr_low\) to [0-9.]+ \(bf16\), fp8 [0-9.]+, inside it .*OK$" 1.0 0.98 300 0.975
pc 1 "fp8 3% below bf16 and 1.5% below the band" "^at the end: .*fp8 [0-9.]+, 1\.52% below its lowest .*FAILED$" \
  1.0 0.97 300 0.985
pc 0 "fp8 5% worse for 20 steps, a band's run 4% worse there" \
  "^on the way: fp8 at most 0\.96% above bf16's band \(bound 3%\), at training steps 101-120: .*OK" 1.05 1.0 300 1.04

# tools/hf_val_loss.py's sequences and documents, cut as docs/DATA.md says cpgen cuts them (no torch needed): a
# sequence every S tokens while S + 1 remain, never across shards; a document at 0 and after each end-of-document token
# before the last position; a version-1 shard has none; shards that disagree on the id, too few sequences, a wrong
# header or a short file exit 1 before anything loads
python3 - "$tmp/hv" tools/hf_val_loss.py >"$tmp/log" 2>&1 <<'PY'
import array, importlib.util, os, struct, subprocess, sys
d, tool = sys.argv[1], sys.argv[2]
os.makedirs(d, exist_ok=True)
spec = importlib.util.spec_from_file_location("hf_val_loss", tool)
h = importlib.util.module_from_spec(spec)
spec.loader.exec_module(h)
def shard(name, toks, eod, version=2, magic=b"CPGTOK01", extra=b""):
    with open(os.path.join(d, name), "wb") as f:
        f.write(magic + struct.pack("<IIQQ", version, 2, len(toks), eod + 1 if version == 2 else 0))
        f.write(array.array("H", toks).tobytes() + extra)
bad = []
def want(what, got, expected):
    if got != expected:
        bad.append(f"{what}: {got}, expected {expected}")
shard("a_0.bin", [5, 6, 0, 7, 8, 9, 0, 0, 3, 4, 5, 0, 6], 0)
shard("a_1.bin", [1, 2, 3, 4, 5, 6, 7, 8, 9], 0)
seqs, eod = h.sequences(os.path.join(d, "a_*.bin"), 4, 5)
want("sequences", [list(s) for s in seqs], [[5, 6, 0, 7, 8], [8, 9, 0, 0, 3], [3, 4, 5, 0, 6], [1, 2, 3, 4, 5],
                                            [5, 6, 7, 8, 9]])
want("eod", eod, 0)
want("documents", [h.documents(s, eod) for s in seqs[:3]], [[(0, 3), (3, 4)], [(0, 3), (3, 4)], [(0, 4)]])
want("documents without an id", h.documents(seqs[0], -1), [(0, 4)])
shard("v1_0.bin", [5, 6, 0, 7, 8], 0, version=1)
want("a version-1 shard's id", h.sequences(os.path.join(d, "v1_*.bin"), 4, 1)[1], -1)
def refused(what, pattern, n, text):
    r = subprocess.run([sys.executable, tool, "ckpt", os.path.join(d, pattern), "4", str(n)], capture_output=True,
                       text=True)
    if r.returncode != 1 or text not in r.stderr:
        bad.append(f"{what}: exit {r.returncode}, {r.stderr.strip()!r}")
refused("too few sequences", "a_*.bin", 6, "holds 5 sequences of 4 + 1 tokens, 6 asked for")
shard("m_0.bin", [5, 6, 0, 7, 8], 0)
shard("m_1.bin", [5, 6, 1, 7, 8], 1)
refused("ids that disagree", "m_*.bin", 1, "disagree on the end-of-document id: [0, 1]")
shard("x_0.bin", [5, 6, 0, 7, 8], 0, magic=b"NOTTOKEN")
refused("a wrong header", "x_*.bin", 1, "not a cpgen token shard")
shard("s_0.bin", [5, 6, 0, 7, 8], 0, extra=b"\0")
refused("a file longer than its header says", "s_*.bin", 1, "the header says 5 tokens")
refused("no shard", "none_*.bin", 1, "no shard matches")
r = subprocess.run([sys.executable, tool, "ckpt", "g", "4", "1", "fp16"], capture_output=True, text=True)
want("an unknown precision: exit", r.returncode, 2)
print("\n".join(bad) or "every cut as cpgen's")
sys.exit(1 if bad else 0)
PY
expect_rc 0 "hf_val_loss: sequences and documents as cpgen cuts them, bad shards refused" $? "$tmp/log"

# 4. run-tests.sh's count
mkdir -p "$tmp/t"
printf '#!/bin/sh\necho fine\n' >"$tmp/t/ok"
printf '#!/bin/sh\necho "sk: skipped: no GPU (none here)"\nexit 77\n' >"$tmp/t/sk"
printf '#!/bin/sh\necho broken\nexit 1\n' >"$tmp/t/bad"
printf '#!/bin/sh\nexit 77\n' >"$tmp/t/mute77"
chmod +x "$tmp/t/"*
tests() { # WANT WHAT PATTERN TEST...
  local want=$1 what=$2 pat=$3
  shift 3
  tools/run-tests.sh "$@" >"$tmp/log" 2>&1
  expect_rc "$want" "run-tests.sh: $what" $? "$tmp/log" "$pat"
}
tests 0 "all passed" "^2 passed, 0 failed, 0 skipped$" "$tmp/t/ok" "$tmp/t/ok"
tests 77 "a skip" "^1 passed, 0 failed, 1 skipped \(sk: no GPU \(none here\)\)$" "$tmp/t/ok" "$tmp/t/sk"
tests 1 "a failure beside a skip" "^1 passed, 1 failed, 1 skipped" "$tmp/t/ok" "$tmp/t/sk" "$tmp/t/bad"
tests 1 "77 without saying skipped" "^0 passed, 1 failed, 0 skipped$" "$tmp/t/mute77"
tests 1 "no test at all" "nothing ran"

echo
[ "$bad" = 0 ] && echo "test_checks.sh: every case as it should be" || echo "test_checks.sh: FAILED"
exit "$bad"
