#!/usr/bin/env bash
# hf_check.sh: cpgen against Hugging Face transformers, one command on a GPU machine with torch and transformers.
# For each case: transformers makes the model from the spec's numbers with a fixed seed (tests/hf/make_model.py,
# fp32 safetensors); cpgen loads it (init.from = "hf"), exports its step-1 gradients and the tokens of the synthetic
# task, and trains 20 steps; tests/gpu/hf_compare.py trains the same in PyTorch and checks the loss (1e-3 against
# fp32), every gradient (cosine >= 0.999, norm within 1e-2) and the 20-step loss curve (1%).
# Cases: tiny (the tiny spec, 2K tokens), qwen3 (the tiny spec as Qwen3: RMSNorm on q and k, tied embeddings,
# Qwen3's eps and RoPE theta) and l8b (two layers of the Llama-3.1-8B shape, 4K tokens).
# HF_SETS="key=value ..." adds overrides to every case (e.g. HF_SETS=parallel.attention_output=host).
# usage: [HF_SETS=...] tests/gpu/hf_check.sh [BUILD_DIR] [CASE...]    (default: build tiny qwen3 l8b); logs under $OUT
# (default out/)
set -u
B=${1:-build}
shift || true
CASES=${*:-tiny qwen3 l8b}
out=${OUT:-out}/hf
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
work=${HF_WORK:-/tmp/cpgen-hf-check}
rc=0
for c in $CASES; do
  case $c in
    tiny) spec=tiny; sets="" ;;
    qwen3) spec=tiny; sets="model.family=qwen3 model.tie_embeddings=true model.norm_eps=1e-6 model.rope.theta=1000000" ;;
    l8b) spec=llama8b; sets="model.layers=2 train.seq_len=4K parallel.gpus=1 train.lr=3e-4" ;;
    *) echo "hf_check.sh: unknown case $c (tiny, qwen3, l8b)"; exit 2 ;;
  esac
  sets="$sets ${HF_SETS:-}"
  d=$work/$c
  rm -rf "$d" && mkdir -p "$d"
  args=()
  for s in $sets; do args+=(--set "$s"); done
  "$B/cpgen" plan "$spec" "${args[@]}" --json >"$d/plan.json" || { echo "$c: plan failed"; rc=1; continue; }
  python3 tests/hf/make_model.py --out "$d/model" --plan-json "$d/plan.json" >"$out/$c.make_model.log" 2>&1 ||
    { echo "$c: make_model.py failed (see $out/$c.make_model.log)"; rc=1; continue; }
  CPGEN_HF_DIR=$d CPGEN_HF_ONLY=1 CPGEN_HF_SPEC=$spec CPGEN_HF_STEPS=20 \
    CPGEN_HF_SETS="init.from=hf init.path=$d/model $sets" \
    "$B/tests/gpu/test_train_tiny" >"$out/$c.cpgen.log" 2>&1 ||
    { echo "$c: cpgen export failed (see $out/$c.cpgen.log)"; tail -5 "$out/$c.cpgen.log"; rc=1; continue; }
  cp "$d/metrics.jsonl" "$out/$c.metrics.jsonl"
  python3 tests/gpu/hf_compare.py "$d" 2>&1 | grep -v "Loading weights" >"$out/$c.compare.log"
  r=${PIPESTATUS[0]}
  echo "== $c ($spec ${sets:-as shipped}): $(tail -1 "$out/$c.compare.log")"
  grep -E "^step 1 against|^loss curve|global norm" "$out/$c.compare.log"
  [ "$r" = 0 ] || rc=1
done
exit $rc
