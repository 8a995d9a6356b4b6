#!/usr/bin/env bash
# gpu-eval-check.sh: the validation loss on a GPU, with a build tree made elsewhere (BUILD holds cpgen and
# tests/gpu/test_validation: `make build/cpgen build/tests/gpu/test_validation`).
#   1. tests/gpu/test_validation: tiny on one GPU in six layouts of one GPU (offloaded checkpoints, the host optimizer,
#      attention outputs kept on the host or the GPU, sparse checkpoints, one micro-batch): the training state read
#      back bit for bit after an evaluation; steps after evaluations equal, as bits, to steps without; with lr = 0 an
#      evaluation of a step's sequences within 1e-5 of that step's loss.
#   2. `cpgen run` of tiny on token shards, in four layouts: one GPU, and with 2 ranks sharing the GPU at hand (the
#      README's --ranks-per-gpu): Ulysses over 2 ranks (--gpus 2 --ranks-per-gpu 2), 2 replicas of 1 GPU, a ring of
#      2 of 1 GPU. data.val is a copy of the training shard (another file, the same tokens), so an evaluation reads
#      the sequences of step 1 (train.eval_sequences defaults to one step's). Per layout three runs of 6 steps:
#        A  evaluating after every step;  B  not evaluating;  C  lr = 0, evaluating after every 2nd step.
#      Checks: A's and B's losses and gradient norms equal as logged (9 digits: a float's last bit), so an evaluation
#      changes nothing of training on any rank; every A step has val_loss over every group's tokens (val_tokens =
#      sequences x seq_len) and the step line says "val loss"; every C val_loss within 1e-5 relative of C's step-1
#      loss (the weights do not move with lr = 0, and the evaluation reads step 1's sequences on every rank and group).
# Exit 0 when everything passed, 1 when something failed, 77 when nothing failed but something could not run here
# (no GPU: before anything runs; see tools/check_common.sh). The table comes last. On one H200: well under 3 minutes.
# usage: [JOBS=4] tools/gpu-eval-check.sh [BUILD_DIR]; logs and runs under $OUT/eval-check
set -u
B=${1:-build}
out=${OUT:-out}/eval-check
rm -rf "$out" && mkdir -p "$out/runs" "$out/res" "$out/data"
. "$(dirname "$0")/check_common.sh" # no GPU: skipped (77) here, before anything runs
[ -x "$B/cpgen" ] || { echo "gpu-eval-check: no $B/cpgen: build first (make build/cpgen)"; exit 1; }
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
JOBS=${JOBS:-4}
STEPS=6
MB=2
t_start=$(date +%s)

# one shard of 32 sequences of random tokens of tiny's vocabulary (docs/DATA.md's format), and the same bytes again
# under another name: the held-out shards of runs that evaluate on the training sequences
python3 - "$out/data" <<'PY' || { echo "gpu-eval-check: could not write the token shards"; exit 1; }
import os, random, struct, sys
d, S = sys.argv[1], 2048
n = 32 * S + 1
rng = random.Random(7)
blob = b"CPGTOK01" + struct.pack("<IIQQ", 1, 2, n, 0) + struct.pack(f"<{n}H", *(rng.randrange(1, 512) for _ in range(n)))
for name in ("train", "val"):
    os.makedirs(f"{d}/{name}", exist_ok=True)
    with open(f"{d}/{name}/shard0.bin", "wb") as f:
        f.write(blob)
PY

# name | layout
layouts=(
  "one|--gpus 1"
  "ulysses2|--gpus 2 --ranks-per-gpu 2"
  "replicas2|--set parallel.gpus=1 --set parallel.replicas=2 --ranks-per-gpu 2"
  "ring2|--set parallel.gpus=1 --set parallel.ring=2 --set parallel.upipe_heads=1 --ranks-per-gpu 2"
)
common=(--set train.micro_batches=$MB --set train.steps=$STEPS --set train.warmup=2 --set train.log_every=1
  --set "data.source=tokens:$out/data/train/*.bin")
val=(--set "data.val=tokens:$out/data/val/*.bin")

# cpgen_run NAME ARGS...: one `cpgen run` into $out/NAME.log, its exit status and seconds in $out/res/NAME.rc
cpgen_run() {
  local name=$1 t0; t0=$(date +%s); shift
  timeout -k 10 150 "$B/cpgen" run tiny "$@" --set "train.out_dir=$out/runs/$name" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$rc $(($(date +%s) - t0))" >"$out/res/$name.rc"
  echo "  [$(($(date +%s) - t_start)) s] $name: exit $rc"
}

layout() {
  local name=$1 args=$2
  # shellcheck disable=SC2086
  cpgen_run "${name}_A" $args "${common[@]}" "${val[@]}" --set train.eval_every=1
  # shellcheck disable=SC2086
  cpgen_run "${name}_B" $args "${common[@]}"
  # shellcheck disable=SC2086
  cpgen_run "${name}_C" $args "${common[@]}" "${val[@]}" --set train.eval_every=2 --set train.lr=0 --set train.min_lr=0
}

# the GPU test beside the runs
unit=$B/tests/gpu/test_validation
if [ -x "$unit" ]; then
  ( t0=$(date +%s); timeout -k 10 170 "$unit" >"$out/test_validation.log" 2>&1
    echo "$? $(($(date +%s) - t0))" >"$out/res/test_validation.rc"
    echo "  [$(($(date +%s) - t_start)) s] test_validation: exit $(cut -d' ' -f1 "$out/res/test_validation.rc")" ) &
else
  echo "127 0" >"$out/res/test_validation.rc"
  echo "no $unit: build it (make build/tests/gpu/test_validation)" >"$out/test_validation.log"
fi
for l in "${layouts[@]}"; do
  IFS='|' read -r name args <<<"$l"
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  layout "$name" "$args" &
done
wait

printf '%s\n' "${layouts[@]}" >"$out/layouts.txt"
python3 - "$out" "$STEPS" "$MB" "$(($(date +%s) - t_start))" <<'PY'
import json, math, os, sys
out, steps, mb, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
S = 2048

def rc(name):
    try:
        a, s = open(f"{out}/res/{name}.rc").read().split()
        return int(a), int(s)
    except (OSError, ValueError):
        return None, 0

def log(name):
    try:
        return open(f"{out}/{name}.log").read()
    except OSError:
        return ""

def last_words(name):
    lines = [l for l in log(name).splitlines() if l.startswith("cpgen:")]
    return lines[-1][:240] if lines else "no message"

def metrics(name):
    rows = []
    try:
        for line in open(f"{out}/runs/{name}/metrics.jsonl"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    return rows

rows, failed, skipped = [], 0, 0
# the GPU test
r, t = rc("test_validation")
text = log("test_validation")
if r == 0:
    res = "ok"
elif r == 77 and "skipped" in text:
    res, skipped = "skipped: " + [l for l in text.splitlines() if "skipped" in l][-1][:200], skipped + 1
else:
    res, failed = f"FAILED: exit {r}: " + (text.strip().splitlines() or ["no output"])[-1][:200], failed + 1
rows.append(("test_validation (1 GPU)", "bits" if r == 0 else "-", "-", "-", "-", str(t), res))

for l in open(f"{out}/layouts.txt").read().splitlines():
    name, args = l.split("|", 1)
    why = []
    for k in "ABC":
        code, _ = rc(f"{name}_{k}")
        if code != 0:
            why.append(f"{name}_{k} exited {code}: {last_words(f'{name}_{k}')}")
    a, b, c = metrics(f"{name}_A"), metrics(f"{name}_B"), metrics(f"{name}_C")
    want = list(range(1, steps + 1))
    for k, m in (("A", a), ("B", b), ("C", c)):
        if [s.get("step") for s in m] != want:
            why.append(f"{k}: steps {[s.get('step') for s in m]}, not 1-{steps}")
    # A against B: every step's loss and norm as logged
    same = [s["step"] for s, t in zip(a, b) if s.get("loss") == t.get("loss") and s.get("norm") == t.get("norm")
            and s.get("loss") is not None]
    diff = [s["step"] for s, t in zip(a, b) if s["step"] not in same]
    if diff or len(same) != steps:
        d = diff[0] if diff else None
        detail = next(((s["loss"], t["loss"], s["norm"], t["norm"]) for s, t in zip(a, b) if s["step"] == d), None)
        why.append(f"A and B differ at steps {diff}" + (f" (step {d}: loss {detail[0]} / {detail[1]}, norm "
                                                        f"{detail[2]} / {detail[3]})" if detail else ""))
    # A: an evaluation after every step, over every group's tokens
    groups = 2 if "replicas" in args else 1
    tokens = mb * groups * S
    evals = [s for s in a if isinstance(s.get("val_loss"), (int, float)) and math.isfinite(s["val_loss"])]
    if len(evals) != steps:
        why.append(f"A: {len(evals)} evaluations of {steps}")
    bad_tok = [s["step"] for s in evals if s.get("val_tokens") != tokens]
    if bad_tok:
        why.append(f"A: val_tokens not {tokens} at steps {bad_tok}")
    alog = log(f"{name}_A")
    if alog.count(" | val loss ") < steps + 1:  # every step line and the done line
        why.append("A: the step lines or the done line do not say val loss")
    # C: lr = 0, every evaluation of step 1's sequences against step 1's loss
    cev = [(s["step"], s["val_loss"]) for s in c if isinstance(s.get("val_loss"), (int, float))]
    ref = c[0]["loss"] if c and isinstance(c[0].get("loss"), (int, float)) else None
    rel = max((abs(v - ref) / abs(ref) for _, v in cev), default=math.nan) if ref else math.nan
    if [k for k, _ in cev] != list(range(2, steps + 1, 2)):
        why.append(f"C: evaluations after steps {[k for k, _ in cev]}, not every 2nd")
    if not rel <= 1e-5:
        why.append(f"C: val_loss {rel:.2e} from step 1's loss (> 1e-5)")
    secs = sum(rc(f"{name}_{k}")[1] for k in "ABC")
    failed += bool(why)
    rows.append((f"{name}", f"{len(same)}/{steps}", f"{len(evals)}/{steps}", f"{rel:.1e}", f"{tokens}", str(secs),
                 "ok" if not why else "FAILED: " + "; ".join(why)))

gpu = os.popen("nvidia-smi -L 2>/dev/null | head -1").read().strip()
print(f"\nvalidation loss on {gpu} in {wall} s (logs: {out})")
print(f"{'case':24} {'A=B bits':>8} {'evals':>6} {'lr0 rel':>8} {'val tok':>8} {'s':>4}  result")
for r in rows:
    print(f"{r[0]:24} {r[1]:>8} {r[2]:>6} {r[3]:>8} {r[4]:>8} {r[5]:>4}  {r[6]}")
print(f"{len(rows) - failed - skipped} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 77 if skipped else 0)
PY
