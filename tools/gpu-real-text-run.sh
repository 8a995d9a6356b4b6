#!/usr/bin/env bash
# gpu-real-text-run.sh: the 1B shape at 32K trained on real text on one GPU, interrupted and resumed.
#   1. shards: the Python standard library's sources (/usr/lib/python3.*/**/*.py, no site- or dist-packages) and the
#      text under /usr/share/doc, tokenised by a byte-level BPE tokenizer of VOCAB (32000) tokens trained on them here
#      (tools/make_tokens.py --train-bpe, no network), 2% of the documents held out as validation shards, each side's
#      documents cut into pieces of PIECE_BYTES (32768, at line ends; 0: whole documents) and shuffled (--shuffle:
#      in path order a run reads one folder's kind of text after another's, and the validation loss on a fixed set
#      swings by a quarter as it does; whole shuffled documents of megabytes, a manual or a changelog, still fill
#      dozens of consecutive steps: with them the validation loss jumped from 5.3 to 7.4 at step 120 and back, and
#      two bf16 runs that differ only in the order of their sums ended 2% apart);
#   2. `cpgen run llama1b --seq 32K --set model.vocab=<the tokenizer's, rounded up to 64>` on the shards for STEPS
#      (300) steps with a checkpoint at SAVE_AT (STEPS / 2), with data.val = the validation shards when this cpgen
#      knows that key (asked of `cpgen plan` first, so the script runs with and without validation support);
#   3. a second run resumed from that checkpoint to STEPS, started beside the first once the checkpoint is complete.
# With COMPARE=fp8 the second run is instead the same run with train.precision = "fp8" from the same start, beside
# the first from step 1 (no checkpoints); COMPARE=nondeterministic makes it bf16 with train.deterministic = false
# (attention's dQ summed in whatever order), whose distance from the first is the noise floor of the comparison;
# SECOND_SETS="KEY=VALUE ..." adds spec settings to that second run (a recipe of fp8: train.fp8_weight_grads=fp8);
# SETS="KEY=VALUE ..." to every run (another start: SETS=init.seed=2). ORACLE=1 (with COMPARE) saves both runs' last
# step and evaluates both sets of weights with one forward, transformers' in bf16 and fp32, on the sequences cpgen
# evaluated (tools/hf_val_loss.py, or HF_VAL_LOSS, judged by tools/oracle_compare.py): whether a gap between the
# runs' validation losses is in their weights or in the forward that measured them.
# LR_BAND=PCT (with COMPARE) runs two more bf16 runs from the same start, at the learning rate PCT% below and above LR
# (3e-4), beside the other two: a run's end moves by more than the comparison's 1% with a change of 10% in the rate
# (docs/PERF.md, 2026-12-04, at night), and the second run is then judged against the band of the three bf16 runs
# (precision_compare.py --band), the rule an FP8 recipe is judged by; about 13 minutes on one H200 with the defaults
# (DEADLINE then 900 s). Where one call is shorter, the band runs in a call of its own: BAND_ONLY=1 trains only its
# two runs (407-411 s on an H200) and leaves their metrics and band.key (the build, shards and settings they ran with)
# in $OUT/real-text; BAND_FROM=DIR then takes them from that folder instead of training them (the pair alone,
# 352-356 s), refused unless its band.key is this call's (bf16 runs of one build, data and settings repeat to the
# digit, docs/PERF.md).
# PACKAGES=1 adds the installed Python packages' sources (python3's site folders, *.py) to the inputs, up to
# MAX_BYTES (default 60 MB with them, else 200 MB) taken in path order: on the GPU machine 14.2M training tokens, which
# the 300 steps read 0.69 times, where the defaults' 3.7M are read 2.7 times and past the first pass the loss
# measures how well a run memorises (the table's "data:" line says how often a token is read).
# Either way 10% of the documents are held out (VAL_FRACTION) and each evaluation reads EVAL_SEQUENCES (8) of them,
# so that the validation loss compared at 1% is not one sequence's; the check is tools/precision_compare.py's, and
# its picture of both runs lands in $out/precision.svg.
# Checks: both runs finish (DEADLINE, default 570 s, bounds the whole); every resumed step's loss within 1e-3 (relative) of the uninterrupted run's; the loss
# falls (the mean of the last 20 steps at least 1 below the mean of the first 20). report.svg and metrics.jsonl of
# both runs, the tokenizer's summary and the logs land in $OUT/real-text. Checkpoints (12.5 GB each) go to
# CKPT_DIR: by default /dev/shm when it has room for two, else $OUT/real-text/runs; every one is deleted once no
# longer needed, and all at the end. The table comes last; exit 0 when every check passed, 1 when one failed, 77
# without a GPU. About 8 to 9 minutes on one H200 with the defaults (steps of about 1 s, the 300 and the 150
# resumed).
# usage: [STEPS=300] [SAVE_AT=150] [VOCAB=32000] [CKPT_DIR=...] [DEADLINE=570] [COMPARE=fp8|nondeterministic]
#        [VAL_FRACTION=0.02] [PIECE_BYTES=32768] [SECOND_SETS="KEY=VALUE ..."] [SETS="KEY=VALUE ..."]
#        [EVAL_SEQUENCES=...] [PACKAGES=1] [ORACLE=1] [LR=3e-4] [LR_BAND=PCT [BAND_ONLY=1 | BAND_FROM=DIR]]
#        tools/gpu-real-text-run.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}/real-text
rm -rf "$out" && mkdir -p "$out"
. "$(dirname "$0")/check_common.sh" # no GPU: skipped (77) here, before anything runs
[ -x "$B/cpgen" ] || { echo "gpu-real-text-run: no $B/cpgen: build first (make)"; exit 2; }
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0 TOKENIZERS_PARALLELISM=true
STEPS=${STEPS:-300}
SAVE_AT=${SAVE_AT:-$((STEPS / 2))}
VOCAB=${VOCAB:-32000}
SEQ=${SEQ:-32K}
COMPARE=${COMPARE:-}
case "$COMPARE" in
  "") ;;
  fp8) second_sets=(--set train.precision=fp8) ;;
  nondeterministic) second_sets=(--set train.deterministic=false) ;;
  *) echo "gpu-real-text-run: COMPARE=$COMPARE: fp8 and nondeterministic are known"; exit 2 ;;
esac
LR=${LR:-3e-4}
band_lr=() band_runs=() band_ok=1
case " ${SETS:-} " in
  *" train.lr="*) echo "gpu-real-text-run: SETS: set the learning rate with LR=, which LR_BAND reads"; exit 2 ;;
esac
if [ -n "${LR_BAND:-}" ]; then
  # shellcheck disable=SC2207
  band_lr=($(python3 -c 'import sys; r, p = float(sys.argv[1]), float(sys.argv[2]); assert 0 < p < 100 and r > 0
print(f"{r * (1 - p / 100):.6g} {r * (1 + p / 100):.6g}")' "$LR" "$LR_BAND" 2>/dev/null)) ||
    { echo "gpu-real-text-run: LR=$LR LR_BAND=$LR_BAND: a rate above 0 and a percentage between 0 and 100"; exit 2; }
  band_runs=(lr_low lr_high)
fi
for v in SECOND_SETS ORACLE LR_BAND; do
  if [ -n "${!v:-}" ] && [ -z "$COMPARE" ]; then
    echo "gpu-real-text-run: $v is for a comparison's runs: set COMPARE too"
    exit 2
  fi
done
for v in BAND_ONLY BAND_FROM; do
  if [ -n "${!v:-}" ] && [ -z "${LR_BAND:-}" ]; then
    echo "gpu-real-text-run: $v is for a band's runs: set LR_BAND too"
    exit 2
  fi
done
if [ -n "${BAND_FROM:-}" ] && { [ -n "${BAND_ONLY:-}" ] || [ ! -s "$BAND_FROM/band.key" ]; }; then
  echo "gpu-real-text-run: BAND_FROM=$BAND_FROM: a folder a BAND_ONLY=1 call left (with band.key), and no BAND_ONLY"
  exit 2
fi
if [ -n "${BAND_ONLY:-}" ] && [ -n "${ORACLE:-}" ]; then
  echo "gpu-real-text-run: ORACLE is for the pair's runs: not with BAND_ONLY"
  exit 2
fi
for kv in ${SECOND_SETS:-}; do second_sets+=(--set "$kv"); done
VAL_FRACTION=${VAL_FRACTION:-$([ -n "$COMPARE" ] && echo 0.1 || echo 0.02)}
t_start=$(date +%s)
if [ -z "${CKPT_DIR:-}" ]; then
  free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
  if [ "${free_kb:-0}" -gt $((30 * 1024 * 1024)) ]; then CKPT_DIR=/dev/shm/cpgen-real-text-$$; else CKPT_DIR=$out/runs; fi
fi
mkdir -p "$CKPT_DIR"
# the checkpoints go whatever happens: 12.5 GB each, in memory or on a 64 GiB disk
drop_checkpoints() {
  rm -rf "$CKPT_DIR"/{full,resumed,fp8,nondeterministic,lr_low,lr_high}
  [ "$CKPT_DIR" = "$out/runs" ] || rmdir "$CKPT_DIR" 2>/dev/null
}
trap drop_checkpoints EXIT
note "checkpoints in $CKPT_DIR; $STEPS steps at $SEQ, a checkpoint at step $SAVE_AT"
deadline=570
# four runs side by side: the band trained beside the pair
[ ${#band_runs[@]} = 0 ] || [ -n "${BAND_ONLY:-}${BAND_FROM:-}" ] || deadline=900
deadline=$((t_start + ${DEADLINE:-$deadline}))
left() { echo $((deadline - $(date +%s))); }

# bg NAME COMMAND...: COMMAND in the background until the deadline, its log in $out/NAME.log and its exit status
# and seconds in $out/NAME.rc; judge NAME PATTERN counts it afterwards as check_common.sh's run would have
bg() {
  local name=$1
  shift
  (
    t0=$(date +%s)
    l=$(left)
    timeout -k 30 "$((l > 1 ? l : 1))" "$@" >"$out/$name.log" 2>&1
    echo "$? $(($(date +%s) - t0))" >"$out/$name.rc"
  ) &
}
judge() {
  local rc s
  read -r rc s <"$out/$1.rc" 2>/dev/null || { rc=1; s=0; }
  note "$(printf '%-22s rc=%-3d %5d s  %s' "$1" "$rc" "$s" "$(grep -m1 -oE "$2" "$out/$1.log" 2>/dev/null)")"
  _status "$1" "$rc" "$out/$1.log" "deadline" " (log: $out/$1.log)"
}

# 1. the shards (INPUTS and TOKENIZER=byte-level replace the defaults, for a machine without the sources or
# `tokenizers`, and for tests/test_checks.sh)
data=$out/data
how=(--train-bpe "$VOCAB")
[ "${TOKENIZER:-bpe}" != byte-level ] || how=(--byte-level)
# shellcheck disable=SC2206
inputs=(${INPUTS:-'/usr/lib/python3.*/**/*.py' /usr/share/doc})
packages=(--exclude '*/site-packages/*' --exclude '*/dist-packages/*')
max_bytes=${MAX_BYTES:-200000000}
if [ "${PACKAGES:-}" = 1 ]; then
  packages=()
  max_bytes=${MAX_BYTES:-60000000}
  for d in $(python3 -c 'import site; print(*site.getsitepackages())'); do [ ! -d "$d" ] || inputs+=("$d/**/*.py"); done
fi
GREP='train: [0-9,]+ tokens' run tokens 300 python3 "$(dirname "$0")/make_tokens.py" "${how[@]}" --shuffle \
  --piece-bytes "${PIECE_BYTES:-32768}" \
  --val-fraction "$VAL_FRACTION" ${packages[@]+"${packages[@]}"} --exclude '*/__pycache__/*' \
  --max-bytes "$max_bytes" --out "$data/text" "${inputs[@]}"
if [ ! -s "$data/text.json" ]; then
  fail "no shards: $(tail -1 "$out/tokens.log")"
else
  read -r model_vocab src val passes SEQ_TOKENS < <(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
seq = sys.argv[3].upper()
seq = int(seq[:-1]) * {"K": 1 << 10, "M": 1 << 20}[seq[-1]] if seq[-1] in "KM" else int(seq)
passes = int(sys.argv[2]) * seq / max(m["shards"]["train"]["tokens"], 1)
print(m["model_vocab"], m["data_source"], m.get("val_source", "-"), f"{passes:.2f}", seq)' \
    "$data/text.json" "$STEPS" "$SEQ")
  note "$(grep -m1 '^tokenizer:' "$out/tokens.log")"
  note "data: $STEPS steps of $SEQ tokens read the training tokens $passes times"
  cp "$data/text.json" "$out/tokens.json"
  args=(llama1b --gpus 1 --seq "$SEQ" --set "model.vocab=$model_vocab" --set "data.source=$src"
    --set "train.steps=$STEPS" --set train.warmup=30 --set "train.lr=$LR" --set train.log_every=10)
  for kv in ${SETS:-}; do args+=(--set "$kv"); done
  # validation loss where this cpgen has it: `cpgen plan` refuses a key it does not know
  if [ "$val" != - ] && "$B/cpgen" plan "${args[@]}" --set "data.val=$val" >"$out/probe_val.log" 2>&1; then
    args+=(--set "data.val=$val")
    [ -z "${EVAL_SEQUENCES:-$COMPARE}" ] || args+=(--set "train.eval_sequences=${EVAL_SEQUENCES:-8}")
    note "validation: data.val = $val"
  else
    note "validation: not asked for (this cpgen does not know data.val: $(grep -m1 'cpgen:' "$out/probe_val.log"))"
  fi

  if [ -n "$COMPARE" ]; then
    # 2. both precisions from the same start, side by side on the GPU (a 1B plan's arena is a fifth of an H200)
    # (with ORACLE=1 each run saves its last step, for the evaluation below)
    second=$COMPARE
    save=0
    [ "${ORACLE:-}" != 1 ] || save=$STEPS
    key=
    # what a band's runs share with the pair: this build, these shards, these settings (the data's folder aside)
    [ ${#band_runs[@]} = 0 ] || key=$({ sha256sum <"$B/cpgen"; cat "$data"/text_*.bin | sha256sum
      echo "LR_BAND=$LR_BAND"; printf '%s\n' "${args[@]}" | sed "s|$data/|DATA/|g"; } | sha256sum | cut -c1-16)
    ran=()
    if [ -n "${BAND_FROM:-}" ]; then
      # LR_BAND: bf16 at the neighbouring rates, from an earlier call of this build, data and settings
      their_key=$(cat "$BAND_FROM/band.key")
      if [ "$their_key" = "$key" ]; then
        for r in "${band_runs[@]}"; do
          cp "$BAND_FROM/metrics_$r.jsonl" "$out/" || { fail "$r: no metrics in $BAND_FROM"; band_ok=; }
        done
        note "band: lr_low and lr_high from $BAND_FROM (band.key $key)"
      else
        fail "band: $BAND_FROM ran with another build, data or settings (band.key $their_key, here" \
          "$key): nothing run; run BAND_ONLY=1 again with this one"
        band_ok=
      fi
    fi
    if [ -z "${BAND_ONLY:-}" ] && [ -n "$band_ok" ]; then
      ran=(full "$second")
      bg full "$B/cpgen" run "${args[@]}" --set "train.save_every=$save" --set "train.out_dir=$CKPT_DIR/full"
      bg "$second" "$B/cpgen" run "${args[@]}" --set "train.save_every=$save" "${second_sets[@]}" \
        --set "train.out_dir=$CKPT_DIR/$second"
    fi
    if [ -z "${BAND_FROM:-}" ]; then
      # LR_BAND: bf16 at the neighbouring rates, beside the pair (or alone, BAND_ONLY)
      for i in ${band_runs[@]+"${!band_runs[@]}"}; do
        ran+=("${band_runs[$i]}")
        bg "${band_runs[$i]}" "$B/cpgen" run "${args[@]}" --set train.save_every=0 --set "train.lr=${band_lr[$i]}" \
          --set "train.out_dir=$CKPT_DIR/${band_runs[$i]}"
      done
      [ -z "$key" ] || echo "$key" >"$out/band.key"
    fi
    wait
    for r in ${ran[@]+"${ran[@]}"}; do judge "$r" '^done: .*'; done
    if [ "${ORACLE:-}" = 1 ] && [ -n "$band_ok" ]; then
      # both runs' last weights through one forward, transformers', on the sequences cpgen evaluated
      for r in full "$second"; do
        GREP='"loss": [0-9.]+' run "oracle_$r" 300 python3 "${HF_VAL_LOSS:-$(dirname "$0")/hf_val_loss.py}" \
          "$CKPT_DIR/$r/ckpt_$STEPS" "${val#tokens:}" "$SEQ_TOKENS" "${EVAL_SEQUENCES:-8}" bf16 fp32
        rm -rf "$CKPT_DIR/$r/ckpt_$STEPS"
      done
    fi
  else
    # 2. the uninterrupted run, saving at SAVE_AT (and at the end, not needed: deleted once written); 3. once that
    # checkpoint is complete, the resumed run beside it on the same GPU (each plan's arena is a sixth of an H200):
    # the GPU's time is what it would be one after the other, but the second run's start and the first run's last
    # save overlap the other's steps, which keeps the whole within one call of ten minutes
    second=resumed
    ran=(full resumed)
    bg full "$B/cpgen" run "${args[@]}" --set "train.save_every=$SAVE_AT" --set "train.out_dir=$CKPT_DIR/full"
    ck=$CKPT_DIR/full/ckpt_$SAVE_AT # renamed into place only when complete
    until [ -e "$ck/trainer_state.json" ] || [ -e "$out/full.rc" ] || [ "$(left)" -le 5 ]; do sleep 2; done
    if [ -e "$ck/trainer_state.json" ]; then
      note "ckpt_$SAVE_AT complete after $(($(date +%s) - t_start)) s: the resumed run starts"
      bg resumed "$B/cpgen" run "${args[@]}" --set train.save_every=0 --set "train.out_dir=$CKPT_DIR/resumed" \
        --resume "$ck"
    else
      echo "1 0" >"$out/resumed.rc"
      echo "cpgen: not started: the uninterrupted run left no $ck" >"$out/resumed.log"
    fi
    wait
    judge full '^done: .*'
    judge resumed '^resumed from [^ ]+'
    rm -rf "$CKPT_DIR"/full/ckpt_* "$CKPT_DIR"/resumed/ckpt_*
  fi
  for r in ${ran[@]+"${ran[@]}"}; do
    cp "$CKPT_DIR/$r/metrics.jsonl" "$out/metrics_$r.jsonl" 2>/dev/null
    # the training steps' lines (an evaluation may have lines of its own)
    grep '"loss"' "$out/metrics_$r.jsonl" >"$out/steps_$r.jsonl" 2>/dev/null
    cp "$CKPT_DIR/$r/report.svg" "$out/report_$r.svg" 2>/dev/null || fail "$r: no report.svg"
  done
  if [ -n "${BAND_ONLY:-}" ]; then
    note "band only: metrics_lr_low.jsonl, metrics_lr_high.jsonl and band.key in $out, for BAND_FROM=$out"
  elif [ -z "$band_ok" ]; then
    : # nothing ran: the band's failure above says why
  elif [ -n "$COMPARE" ]; then
    band_args=()
    for r in ${band_runs[@]+"${band_runs[@]}"}; do band_args+=("$r=$out/metrics_$r.jsonl"); done
    [ ${#band_args[@]} = 0 ] || band_args=(--band "${band_args[@]}")
    check "$second against bf16" python3 "$(dirname "$0")/precision_compare.py" "$out/metrics_full.jsonl" \
      "$out/metrics_$second.jsonl" "$STEPS" "$out/precision.svg" "llama1b at $SEQ on real text: bf16 and $second" \
      "$second" ${band_args[@]+"${band_args[@]}"}
    [ "$COMPARE" != fp8 ] || [ ${#band_args[@]} != 0 ] ||
      note "judged: against one bf16 run; an FP8 recipe is judged against bf16's band (LR_BAND=10, docs/PERF.md)"
    [ "${ORACLE:-}" != 1 ] || check "one forward for both" python3 "$(dirname "$0")/oracle_compare.py" \
      "$out/metrics_full.jsonl" "$out/oracle_full.log" "$out/metrics_$second.jsonl" "$out/oracle_$second.log" "$second"
  else
    compare_loss "resumed against uninterrupted" "$out/steps_full.jsonl" "$out/steps_resumed.jsonl" "$STEPS" \
      $((SAVE_AT + 1))
    check "loss falls" python3 - "$out/metrics_full.jsonl" "$STEPS" <<'PY'
import json, math, sys
all_rows = []
for l in open(sys.argv[1]):
    try: all_rows.append(json.loads(l))
    except ValueError: pass
rows = [r for r in all_rows if "loss" in r]
loss = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
if len(loss) < 40 or len(rows) != int(sys.argv[2]):
    print(f"loss falls: FAILED: {len(loss)} finite losses of {len(rows)} steps, {sys.argv[2]} asked for")
    sys.exit(1)
a, b = sum(loss[:20]) / 20, sum(loss[-20:]) / 20
val = [r["val_loss"] for r in all_rows if isinstance(r.get("val_loss"), (int, float))]
ok = b <= a - 1.0
print(f"loss: mean of the first 20 steps {a:.3f}, of the last 20 {b:.3f} (at least 1 lower) "
      f"{'OK' if ok else 'FAILED'}" + (f"; validation loss {val[0]:.3f} -> {val[-1]:.3f}" if val else ""))
sys.exit(0 if ok else 1)
PY
  fi
fi

# the verdict, then the table last
( finish ) >"$out/verdict.txt"
verdict=$?
grep -v '^$' "$out/verdict.txt"
echo
echo "real text on $(nvidia-smi -L | head -1), in $(($(date +%s) - t_start)) s"
sed -n 's/^\(tokens\|full\|resumed\|fp8\|nondeterministic\|lr_low\|lr_high\|oracle_[a-z0-9]*\) \+rc=/&/p' "$sum" |
  sed 's/^/  /'
grep -E '^(loss:|resumed against|tokenizer:|data:|validation:|training loss:|on the way:|bf16.s band|at the end:|'\
'against bf16 alone|one forward|judged:)' "$sum" | sed 's/^/  /'
if [ -n "${BAND_ONLY:-}" ]; then
  echo "  files: $out/metrics_lr_low.jsonl, metrics_lr_high.jsonl, band.key, tokens.json"
else
  echo "  files: $out/report_full.svg, $out/report_${second:-resumed}.svg, metrics_*.jsonl, tokens.json"
fi
exit "$verdict"
