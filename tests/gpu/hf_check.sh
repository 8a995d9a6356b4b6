#!/usr/bin/env bash
# hf_check.sh: cpgen against Hugging Face transformers, one command on a GPU machine with torch and transformers.
# For each case: transformers makes the model from the spec's numbers with a fixed seed (tests/hf/make_model.py,
# fp32 safetensors); cpgen loads it (init.from = "hf"), exports its step-1 gradients and the tokens of the synthetic
# task, and trains 20 steps; tests/gpu/hf_compare.py trains the same in PyTorch and checks the loss (1e-3 against
# fp32), every gradient (cosine >= 0.999, norm within 1e-2) and the 20-step loss curve (1%).
# Cases: tiny (the tiny spec, 2K tokens), qwen3 (the tiny spec as Qwen3: RMSNorm on q and k, tied embeddings,
# Qwen3's eps and RoPE theta) and l8b (two layers of the Llama-3.1-8B shape, 4K tokens).
# HF_SETS="key=value ..." adds overrides to every case (e.g. HF_SETS=parallel.attention_output=host).
# Exit 0 when every case matches, 1 when one does not (or a step fails), 77 without a GPU (tools/check_common.sh).
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
. "$(dirname "$0")/../../tools/check_common.sh"
for c in $CASES; do
  case $c in
    tiny) spec=tiny; sets="" ;;
    qwen3) spec=tiny; sets="model.family=qwen3 model.tie_embeddings=true model.norm_eps=1e-6 model.rope.theta=1000000" ;;
    l8b) spec=llama8b; sets="model.layers=2 train.seq_len=4K parallel.gpus=1 train.lr=3e-4" ;;
    *) fail "unknown case $c (tiny, qwen3, l8b)"; continue ;;
  esac
  sets="$sets ${HF_SETS:-}"
  d=$work/$c
  rm -rf "$d" && mkdir -p "$d"
  args=()
  for s in $sets; do args+=(--set "$s"); done
  # A step's failure fails the case and skips its later steps, which would only fail for want of its output. The
  # plan's stdout alone: cpgen says some things on stderr beside --json.
  if "$B/cpgen" plan "$spec" ${args[@]+"${args[@]}"} --json >"$d/plan.json" 2>"$out/$c.plan.err"; then
    pass
  else
    fail "$c: cpgen plan failed: $(tail -1 "$out/$c.plan.err")"
    continue
  fi
  run "$c.make_model" 600 python3 tests/hf/make_model.py --out "$d/model" --plan-json "$d/plan.json" || continue
  CPGEN_HF_DIR=$d CPGEN_HF_ONLY=1 CPGEN_HF_SPEC=$spec CPGEN_HF_STEPS=20 \
    CPGEN_HF_SETS="init.from=hf init.path=$d/model $sets" \
    run "$c.cpgen" 1200 "$B/tests/gpu/test_train_tiny" || { tail -5 "$out/$c.cpgen.log"; continue; }
  cp "$d/metrics.jsonl" "$out/$c.metrics.jsonl"
  run "$c.compare" 1200 python3 tests/gpu/hf_compare.py "$d"
  echo "== $c ($spec ${sets:-as shipped}): $(tail -1 "$out/$c.compare.log")"
  grep -E "^step 1 against|^loss curve|global norm" "$out/$c.compare.log"
done
finish
