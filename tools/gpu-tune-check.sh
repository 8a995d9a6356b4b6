#!/usr/bin/env bash
# gpu-tune-check.sh: on one H200 (sm_90a), with a build tree made elsewhere: the kernel variants and the kernel
# tuning cache. test_attention_variants (every depth of fwd_sm90's K/V ring gives the default's bits), then
# `cpgen tune-kernels` on the 3B shape's attention at 32K and 128K (each variant timed, the winner recorded), then
# `cpgen plan` at both lengths, which must take the winners from the cache, and once more with the cache file made bad,
# which must be ignored with one warning. The cache and the JIT cache live under $OUT (XDG_CACHE_HOME), so the
# machine's own are left alone. Ends with the timing tables. Logs under $OUT.
# PARTS (default "variants kernels") picks parts; "tune" adds cpgen tune llama3b --seq 32K --budget ${BUDGET:-5m}.
# Exit 0 when every check holds, 1 when one fails, 77 when one was skipped (test_attention_variants off sm_90a)
# (tools/check_common.sh).
# usage: tools/gpu-tune-check.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}
mkdir -p "$out"
PARTS=${PARTS:-variants kernels}
source "$(dirname "$0")/check_common.sh"
export XDG_CACHE_HOME="$(cd "$out" && pwd)/cache" # absolute: the XDG spec ignores relative values
cache="$XDG_CACHE_HOME/cpgen/tuning.json"
rm -f "$cache"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
# only sm_90a's attention forward has variants: elsewhere tune-kernels has no winner to write, which is no failure
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
hopper() { [ "$cc" = 9.0 ] || { skip "$1: needs sm_90a (GPU 0: compute capability ${cc:-unknown})"; false; }; }

if want variants; then
  GREP='PASSED.*|FAILED.*' run variants 600 "$B/tests/gpu/test_attention_variants"
fi
if want kernels && hopper kernels; then
  for seq in 32K 128K; do
    GREP='wrote [0-9]+ winners? to the kernel tuning cache' run "tune_kernels_$seq" 600 \
      "$B/cpgen" tune-kernels llama3b --seq "$seq" -o "$out/kernels_$seq"
    expect "tune_kernels_$seq" 'wrote [1-9][0-9]* winners? to the kernel tuning cache' 'no winner written to the cache'
    GREP='kernels   .*' run "plan_$seq" 120 "$B/cpgen" plan llama3b --seq "$seq"
    expect "plan_$seq" "from the tuning cache" "the plan did not take the cached winner"
  done
  if [ ! -f "$cache" ]; then
    fail "no kernel tuning cache at $cache after tune-kernels: the bad-cache check could not run"
  else
    cp "$cache" "$out/tuning.json"
    printf '{"format": "cpgen-tuning-1", "entries": [' >"$cache" # cut short: not JSON
    GREP='warning: kernel tuning cache .* ignored' run plan_bad_cache 120 "$B/cpgen" plan llama3b --seq 32K
    if [ "$(grep -c 'kernel tuning cache .* ignored' "$out/plan_bad_cache.log")" = 1 ] &&
      grep -q "K/V stages, the default" "$out/plan_bad_cache.log"; then
      pass
    else
      fail "plan_bad_cache: expected one warning and the default kernels"
    fi
    cp "$out/tuning.json" "$cache"
  fi
fi
if want tune; then
  GREP='kernel variants of candidate .*' run tune 900 "$B/cpgen" tune llama3b --seq 32K --budget "${BUDGET:-5m}" \
    -o "$out/tune"
  expect tune 'measured [1-9][0-9]* candidates' 'no candidate was measured'
fi

echo
for seq in 32K 128K; do
  [ -f "$out/tune_kernels_$seq.log" ] && sed -n '/^kernel timing/,/^wrote/p' "$out/tune_kernels_$seq.log"
done
[ -f "$out/tune.log" ] && sed -n '/^kernel variants, timed/,/^$/p' "$out/tune.log"
echo
cat "$sum"
finish
