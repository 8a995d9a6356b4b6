#!/usr/bin/env bash
# hf_check.sh: cpgen against Hugging Face transformers, one command on a GPU machine with torch and transformers.
# For each case: transformers makes the model from the spec's numbers with a fixed seed (tests/hf/make_model.py,
# fp32 safetensors); cpgen loads it (init.from = "hf"), exports its step-1 gradients and the tokens of the synthetic
# task, and trains 20 steps; tests/gpu/hf_compare.py trains the same in PyTorch and checks the loss (1e-3 against
# fp32), every gradient (cosine >= 0.999, norm within 1e-2) and the 20-step loss curve (1%).
# Cases: tiny (the tiny spec, 2K tokens), qwen3 (the tiny spec as Qwen3: RMSNorm on q and k, tied embeddings,
# Qwen3's eps and RoPE theta) and l8b (two layers of the Llama-3.1-8B shape, 4K tokens); on packed documents
# (data.source = synthetic:packed: documents masked, RoPE positions restarting at each, its defaults) packed (the
# tiny spec) and l8b_packed (two layers of the 8B shape at 16K tokens). For those hf_compare.py gives transformers
# the same packed sequences with position_ids restarting at every document start and a block-diagonal causal mask,
# and first checks that this reference equals its documents run one by one (1e-5 in fp32).
# HF_SETS="key=value ..." adds overrides to every case (e.g. HF_SETS=parallel.attention_output=host). HF_PYTHON
# names the Python that runs make_model.py and hf_compare.py (default python3; tests/test_checks.sh gives a stand-in).
# Exit 0 when every case matches, 1 when one does not (or a step fails), 77 without a GPU (tools/check_common.sh).
# usage: [HF_SETS=...] tests/gpu/hf_check.sh [BUILD_DIR] [CASE...]    (default: build, every case); logs under $OUT
# (default out/)
set -u
B=${1:-build}
shift || true
CASES=${*:-tiny qwen3 l8b packed l8b_packed}
out=${OUT:-out}/hf
mkdir -p "$out"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
work=${HF_WORK:-/tmp/cpgen-hf-check}
py=${HF_PYTHON:-python3}
. "$(dirname "$0")/../../tools/check_common.sh"
for c in $CASES; do
  case $c in
    tiny) spec=tiny; sets="" ;;
    qwen3) spec=tiny; sets="model.family=qwen3 model.tie_embeddings=true model.norm_eps=1e-6 model.rope.theta=1000000" ;;
    l8b) spec=llama8b; sets="model.layers=2 train.seq_len=4K parallel.gpus=1 train.lr=3e-4" ;;
    packed) spec=tiny; sets="data.source=synthetic:packed" ;;
    l8b_packed) spec=llama8b; sets="model.layers=2 train.seq_len=16K parallel.gpus=1 train.lr=3e-4 data.source=synthetic:packed" ;;
    *) fail "unknown case $c (tiny, qwen3, l8b, packed, l8b_packed)"; continue ;;
  esac
  sets="${sets}${HF_SETS:+${sets:+ }$HF_SETS}"
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
  run "$c.make_model" 600 "$py" tests/hf/make_model.py --out "$d/model" --plan-json "$d/plan.json" || continue
  CPGEN_HF_DIR=$d CPGEN_HF_ONLY=1 CPGEN_HF_SPEC=$spec CPGEN_HF_STEPS=20 \
    CPGEN_HF_SETS="init.from=hf init.path=$d/model $sets" \
    run "$c.cpgen" 1200 "$B/tests/gpu/test_train_tiny" || { tail -5 "$out/$c.cpgen.log"; continue; }
  cp "$d/metrics.jsonl" "$out/$c.metrics.jsonl"
  run "$c.compare" 1200 "$py" tests/gpu/hf_compare.py "$d"
  # a packed case must have been compared as one: its reference checked against its documents run alone
  case $c in *packed) expect "$c.compare" "^documents alone against packed" "not compared as packed documents" ;; esac
  echo "== $c ($spec ${sets:-as shipped}): $(tail -1 "$out/$c.compare.log")"
  grep -E "^step 1 against|^loss curve|global norm|^documents|^packed documents" "$out/$c.compare.log"
done
finish
