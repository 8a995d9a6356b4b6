#!/usr/bin/env bash
# deploy.sh: an ahead-of-time deployment. Build a bundle of the spec's kernels where NVRTC is installed, then train
# from it as a deployment image without libnvrtc would: the NVRTC cpgen would load is a path that does not exist
# (CPGEN_NVRTC_LIB), so any attempt to compile fails loudly, and the run must come from the bundle's cubins alone.
# Without a GPU the second step checks the bundle (plan, architecture, every cubin's SHA-256) and prints the plan.
# usage: [SPEC=tiny] [ARCH=sm_90a,sm_80] [OUT=/tmp/cpgen-deploy] examples/deploy.sh [BUILD_DIR]
set -euo pipefail
B=${1:-build}
SPEC=${SPEC:-tiny}
ARCH=${ARCH:-sm_90a,sm_80}
OUT=${OUT:-/tmp/cpgen-deploy}
mkdir -p "$OUT"

echo "== cpgen links no NVRTC:"
if ldd "$B/cpgen" | grep -i nvrtc; then echo "deploy.sh: $B/cpgen links libnvrtc; rebuild it" >&2; exit 1; fi
echo "   (ldd lists no libnvrtc)"

echo "== 1. the bundle, made where NVRTC is installed"
"$B/cpgen" aot "$SPEC" -o "$OUT/bundle" --arch "$ARCH"

echo "== 2. a run from the bundle with NVRTC out of reach"
CPGEN_NVRTC_LIB=/nonexistent/libnvrtc.so.13 "$B/cpgen" run "$OUT/bundle" --set train.out_dir="$OUT/run" | tee "$OUT/run.log"
grep -q "from the bundle\|nothing is compiled" "$OUT/run.log"

echo "== 3. the same machine refuses a plain run with a message that names the fix"
if CPGEN_NVRTC_LIB=/nonexistent/libnvrtc.so.13 "$B/cpgen" build "$SPEC" 2>"$OUT/no_nvrtc.err" >/dev/null; then
    echo "deploy.sh: compiling without NVRTC succeeded?" >&2; exit 1
fi
cat "$OUT/no_nvrtc.err"
