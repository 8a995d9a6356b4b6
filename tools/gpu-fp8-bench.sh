#!/usr/bin/env bash
# gpu-fp8-bench.sh: the FP8 recipes' training step against bf16's, in one call on one GPU, each beside its plan.
# Method: `cpgen run SPEC --gpus 1 --seq SEQ --set train.steps=STEPS` (default llama3b, 32K, 6 steps) in bf16 first,
# then once for each recipe of RECIPES: NAME or NAME:KEY=VALUE,KEY=VALUE, each with train.precision = "fp8" and the
# settings it names (default: "fp8" the default recipe, "fp8_wgrad:train.fp8_weight_grads=fp8" the weights'
# gradients on FP8 too, "fp8_tensor:train.fp8_scaling=tensor" one scale per tensor). EXTRA="KEY=VALUE ..." goes to
# every run, bf16's too (e.g. parallel.mlp_tile=16K). Each run's step is the median of its steps 2 on (step 1 warms
# up); its prediction is `cpgen plan`'s with the same settings; its ratio is bf16's step over its own. With TRACE=1
# each run's third step is traced (cpgen run --trace) and its kernels summed by what they do (attention, the layers'
# GEMMs, the weights' gradients, casts, ...), measured beside predicted, and every GEMM's time by name, run beside run.
# Checks: every run logs each of its steps once and ends; each step's GPU memory within 1% of its plan; each plan
# prints its predicted step; with TRACE=1 each trace exists. The table comes last (table.txt). Exit 0 when every
# check passed, 1 when one failed, 77 without a GPU (tools/check_common.sh). Logs under $OUT/fp8-bench (default out/).
# About 40 s a run for the 3B at 32K on one H200; the 8B at 128K takes 3 minutes a run with STEPS=2.
# usage: [SPEC=llama3b] [SEQ=32K] [STEPS=6] [RECIPES="fp8 fp8_wgrad:train.fp8_weight_grads=fp8 ..."]
#        [EXTRA="KEY=VALUE ..."] [TRACE=1] tools/gpu-fp8-bench.sh [BUILD_DIR]
set -u
B=${1:-build}
out=${OUT:-out}/fp8-bench
rm -rf "$out" && mkdir -p "$out"
. "$(dirname "$0")/check_common.sh"
[ -x "$B/cpgen" ] || { echo "gpu-fp8-bench: no $B/cpgen: build first (make)"; exit 2; }
SPEC=${SPEC:-llama3b}
SEQ=${SEQ:-32K}
STEPS=${STEPS:-6}
RECIPES=${RECIPES:-fp8 fp8_wgrad:train.fp8_weight_grads=fp8 fp8_tensor:train.fp8_scaling=tensor}
case $STEPS in '' | *[!0-9]* | 0 | 1) echo "gpu-fp8-bench: STEPS=$STEPS: give 2 or more (step 1 warms up)"; exit 2 ;; esac
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
common=(--set "train.steps=$STEPS" --set train.warmup=1)
for kv in ${EXTRA:-}; do common+=(--set "$kv"); done
names=(bf16)
declare -A sets=([bf16]="")
for r in $RECIPES; do
  name=${r%%:*}
  case $name in bf16 | '' | *[!A-Za-z0-9_]*) echo "gpu-fp8-bench: recipe name \"$name\": letters, digits, _; not bf16"; exit 2 ;; esac
  s="train.precision=fp8"
  [ "$r" = "$name" ] || s="$s ${r#*:}"
  names+=("$name")
  sets[$name]=${s//,/ }
done
for name in "${names[@]}"; do
  args=("$SPEC" --gpus 1 --seq "$SEQ" "${common[@]}")
  for kv in ${sets[$name]}; do args+=(--set "$kv"); done
  "$B/cpgen" plan "${args[@]}" >"$out/plan_$name.log" 2>&1
  trace=()
  [ -z "${TRACE:-}" ] || trace=(--trace "$out/trace_$name.json" --trace-step 3)
  GREP="median step [0-9.]+ s" run "$name" 900 "$B/cpgen" run "${args[@]}" --set "train.out_dir=$out/runs/$name" \
    ${trace[@]+"${trace[@]}"}
done

check table python3 - "$out" "$STEPS" "${TRACE:-}" "${names[@]}" <<'PY'
import json, re, statistics, sys
out, steps, trace, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
bad, rows, medians, gemms = [], [], {}, {}
for n in names:
    pred = None
    try:
        m = re.search(r"^predicted step: ([0-9.]+) s", open(f"{out}/plan_{n}.log").read(), re.M)
        pred = float(m.group(1)) if m else None
    except OSError:
        pass
    if pred is None:
        bad.append(f"{n}: no predicted step in plan_{n}.log")
    try:
        recs = [json.loads(l) for l in open(f"{out}/runs/{n}/metrics.jsonl") if l.strip()]
    except OSError as e:
        bad.append(f"{n}: no metrics.jsonl ({e.strerror})")
        rows.append((n, pred, None, None))
        continue
    except ValueError as e:
        bad.append(f"{n}: metrics.jsonl: {e}")
        rows.append((n, pred, None, None))
        continue
    recs = [r for r in recs if isinstance(r.get("step"), int) and "seconds" in r]
    if [r["step"] for r in recs] != list(range(1, steps + 1)):
        bad.append(f"{n}: steps {[r['step'] for r in recs]}, not each of 1-{steps} once")
    mem = max((abs(r["mem_measured"] - r["mem_planned"]) / r["mem_planned"] for r in recs
               if r.get("mem_planned")), default=float("inf"))
    if not mem <= 0.01:
        bad.append(f"{n}: GPU memory {100 * mem:.2f}% from its plan (bound 1%)")
    later = [r["seconds"] for r in recs if r["step"] >= 2]
    medians[n] = statistics.median(later) if later else None
    rows.append((n, pred, medians[n], mem))
base = medians.get("bf16")
f = lambda v, fmt: fmt.format(v) if isinstance(v, (int, float)) else "-"
print(f"{'run':14s} {'predicted':>10s} {'measured':>10s} {'x bf16':>8s} {'memory from plan':>17s}")
for n, pred, med, mem in rows:
    ratio = base / med if base and med else None
    print(f"{n:14s} {f(pred, '{:.2f} s'):>10s} {f(med, '{:.3f} s'):>10s} {f(ratio, '{:.3f}'):>8s} "
          f"{f(None if mem is None else 100 * mem, '{:.2f}%'):>17s}")
if trace:
    def kind(a):
        if a["kind"] == "gemm":
            return "gemm lm head" if a["layer"] < 0 else "gemm weights' grads" if a["what"].startswith("d_w") \
                else "gemm layers"
        return a["what"]
    for n in names:
        try:
            ev = json.load(open(f"{out}/trace_{n}.json"))["traceEvents"]
        except (OSError, ValueError) as e:
            bad.append(f"{n}: trace: {e}")
            continue
        parts = {}
        for e in ev:
            if e.get("ph") == "X" and e.get("pid") == 0:
                p = parts.setdefault(kind(e["args"]), [0, 0.0, 0.0])
                p[0] += 1
                p[1] += e["dur"] / 1e3
                p[2] += e["args"].get("predicted_us", 0) / 1e3
                if e["args"]["kind"] == "gemm":
                    g = gemms.setdefault(e["args"]["what"], {}).setdefault(n, [0, 0.0])
                    g[0] += 1
                    g[1] += e["dur"] / 1e3
        print(f"\n{n}, step 3 traced: {sum(p[1] for p in parts.values()):.1f} ms of slices on rank 0")
        for k, (c, ms, pr) in sorted(parts.items(), key=lambda x: -x[1][1])[:12]:
            print(f"  {k:28s} {c:6d} {ms:9.1f} ms  (predicted {pr:.1f})")
    if gemms:  # each GEMM by name, ms over the traced step, run beside run
        print(f"\n{'GEMM (ms, traced step)':24s}" + "".join(f"{n:>16s}" for n in names))
        for w in sorted(gemms, key=lambda w: -max(v[1] for v in gemms[w].values())):
            print(f"{w:24s}" + "".join(f"{gemms[w][n][1]:10.1f} ({gemms[w][n][0]:3d})" if n in gemms[w]
                                       else f"{'-':>16s}" for n in names))
for b in bad:
    print(f"FAILED: {b}")
sys.exit(1 if bad else 0)
PY
cp "$sum" "$out/table.txt"
finish
