#!/usr/bin/env bash
# gpu-relayout-check.sh: a checkpoint written on one layout resumes on another with the losses of continuing on the
# first (docs/CHECKPOINTS.md, "Resuming on another layout"), all ranks sharing the one GPU at hand
# (`--ranks-per-gpu`, each rank its own NCCL host over sockets).
#   - reference: tiny (2 sequences a step) on one GPU, 20 steps, a checkpoint at step 10;
#   - its ckpt_10 resumed to step 20 on Ulysses 4, ring 2, UPipe stages of 1 head (one GPU's default is 4),
#     every checkpoint offloaded, the optimizer on the host, and 2 replicas of 1 micro-batch: every resumed step's
#     loss within 1e-3 and gradient norm within 1e-2 (relative) of the reference's, and the run's note that it
#     resumed on another layout;
#   - the reverse: tiny on Ulysses 4, 20 steps with a checkpoint at step 10, resumed on one GPU against it;
#   - the data guarded: the reference's checkpoint with another train.seq_len is refused, naming --resume-new-data,
#     and with --resume-new-data it runs, saying what changed.
# The table comes last; the exit status is 0 when every case passed, 1 when one failed, 77 without a GPU.
# DEADLINE (seconds, default 230): no run starts after it and each run's limit ends there, so the table always
# comes (a case cut short fails). About 2 minutes on one H200.
# usage: [JOBS=4] [DEADLINE=230] tools/gpu-relayout-check.sh [BUILD_DIR]; logs under $OUT/relayout-check
set -u
B=${1:-build}
out=${OUT:-out}/relayout-check
rm -rf "$out" && mkdir -p "$out/runs" "$out/res"
. "$(dirname "$0")/check_common.sh" # no GPU: skipped (77) here, before anything runs
[ -x "$B/cpgen" ] || { echo "gpu-relayout-check: no $B/cpgen: build first (make)"; exit 2; }
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
JOBS=${JOBS:-4}
set_deadline "${DEADLINE:-230}" # left, run_case: check_common.sh

tiny=(tiny --set train.micro_batches=2 --set train.steps=20 --set train.warmup=2 --set train.log_every=1)
# name | ranks | the layout's settings | the run it resumes (its ckpt_10) and is compared with
cases=(
  "ulysses4|4|--gpus 4|ref"
  "ring2|2|--set parallel.ring=2 --set parallel.upipe_heads=1|ref"
  "upipe1|1|--set parallel.upipe_heads=1|ref"
  "offload|1|--set parallel.offload=all|ref"
  "optimizer_host|1|--set parallel.optimizer=host|ref"
  "replicas2|2|--set parallel.replicas=2 --set train.micro_batches=1|ref"
  "to_one_gpu|1||save_ulysses4"
)


# The runs that save: the reference on one GPU, then (beside the resumed runs) Ulysses 4 for the reverse.
run_case ref 120 "${tiny[@]}" --set train.save_every=10 --set "train.out_dir=$out/runs/ref"
run_case save_ulysses4 200 "${tiny[@]}" --gpus 4 --ranks-per-gpu 4 --set train.save_every=10 \
  --set "train.out_dir=$out/runs/save_ulysses4" &
for c in "${cases[@]}"; do
  IFS='|' read -r name ranks sets from <<<"$c"
  [ "$from" = ref ] || continue
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  share=()
  [ "$ranks" -le 1 ] || share=(--ranks-per-gpu "$ranks")
  # shellcheck disable=SC2086
  run_case "$name" 150 "${tiny[@]}" $sets ${share[@]+"${share[@]}"} --set train.save_every=0 \
    --set "train.out_dir=$out/runs/$name" --resume "$out/runs/ref/ckpt_10" &
done
# the data that comes next may not change silently: refused, then taken when asked for
run_case refuse_seq 60 "${tiny[@]}" --set train.seq_len=1K --set train.save_every=0 \
  --set "train.out_dir=$out/runs/refuse_seq" --resume "$out/runs/ref/ckpt_10" &
run_case new_data 120 "${tiny[@]}" --set train.seq_len=1K --set train.save_every=0 \
  --set "train.out_dir=$out/runs/new_data" --resume "$out/runs/ref/ckpt_10" --resume-new-data &
wait
run_case to_one_gpu 120 "${tiny[@]}" --set train.save_every=0 --set "train.out_dir=$out/runs/to_one_gpu" \
  --resume "$out/runs/save_ulysses4/ckpt_10"

# the table: every case's verdict counted through check_common.sh's helpers, the table printed last
printf '%s\n' "${cases[@]}" >"$out/cases.txt"
python3 - "$out" >"$out/table.txt" <<'PY'
import json, math, os, sys
out = sys.argv[1]
def metrics(name):
    rows = []
    try:
        for line in open(f"{out}/runs/{name}/metrics.jsonl"):
            try: rows.append(json.loads(line))
            except ValueError: pass
    except OSError: pass
    return rows
def rc(name):
    try: a, s = open(f"{out}/res/{name}.rc").read().split(); return int(a), int(s)
    except (OSError, ValueError): return None, 0
def log(name):
    try: return open(f"{out}/{name}.log", errors="replace").read()
    except OSError: return ""
def last_words(name):
    lines = [l for l in log(name).splitlines() if l.startswith("cpgen:")]
    return lines[-1][:200] if lines else "no message"
def rel(x, ref):
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (x, ref))
    return abs(x - ref) / abs(ref) if ok and ref else (0.0 if ok and x == ref else math.inf)
rows, failed = [], 0
for c in open(f"{out}/cases.txt").read().splitlines():
    name, ranks, sets, src = c.split("|")
    why = []
    for n in (src, name):
        r, _ = rc(n)
        if r != 0: why.append(f"{n} exited {r}: {last_words(n)}")
    ref = {s["step"]: s for s in metrics(src)}
    res = metrics(name)
    steps = [s["step"] for s in res]
    if steps != list(range(11, 21)): why.append(f"resumed steps {steps[:1]}..{steps[-1:]} ({len(steps)}), not 11-20 once")
    if sorted(ref) != list(range(1, 21)): why.append(f"{src}: steps {len(ref)} of 20")
    lrel = max((rel(s["loss"], ref[s["step"]]["loss"]) for s in res if s["step"] in ref), default=math.inf)
    nrel = max((rel(s["norm"], ref[s["step"]]["norm"]) for s in res if s["step"] in ref), default=math.inf)
    if not lrel <= 1e-3: why.append(f"loss {lrel:.2e} > 1e-3")
    if not nrel <= 1e-2: why.append(f"norm {nrel:.2e} > 1e-2")
    noted = "note: another layout than the checkpoint's run" in log(name)
    if not noted: why.append("no note of the other layout")
    failed += bool(why)
    layout = sets.replace("--set ", "").replace("parallel.", "") or "1 GPU"
    rows.append((name, f"{ranks}", layout, src, f"{lrel:.1e}", f"{nrel:.1e}", f"{rc(name)[1]}",
                 "ok" if not why else "FAILED: " + "; ".join(why)))
# the data guard
why = []
r, s1 = rc("refuse_seq")
if r in (None, 0, 124, 137): why.append(f"exit {r}, not a refusal")
if "or pass --resume-new-data" not in log("refuse_seq"): why.append("no message naming --resume-new-data")
if metrics("refuse_seq"): why.append("it trained")
failed += bool(why)
rows.append(("refuse_seq", "1", "train.seq_len=1K", "ref", "-", "-", f"{s1}", "ok" if not why else "FAILED: " + "; ".join(why)))
why = []
r, s2 = rc("new_data")
if r != 0: why.append(f"exit {r}: {last_words('new_data')}")
if "note: --resume-new-data: train.seq_len is 1024" not in log("new_data"): why.append("no note of the change")
if [s["step"] for s in metrics("new_data")] != list(range(11, 21)): why.append("not steps 11-20")
failed += bool(why)
rows.append(("new_data", "1", "train.seq_len=1K --resume-new-data", "ref", "-", "-", f"{s2}",
             "ok" if not why else "FAILED: " + "; ".join(why)))
print(f"{'case':16} {'ranks':>5} {'layout':44} {'from':14} {'loss':>8} {'norm':>8} {'s':>4}  result")
for row in rows:
    print(f"{row[0]:16} {row[1]:>5} {row[2]:44} {row[3]:14} {row[4]:>8} {row[5]:>8} {row[6]:>4}  {row[7]}")
print(f"{len(rows) - failed} of {len(rows)} cases passed (resumed steps 11-20 against the run that was not "
      f"stopped; loss and norm: the worst relative difference)")
sys.exit(1 if failed else 0)
PY
table_rc=$?
while IFS= read -r line; do
  case $line in
    *" ok") pass ;;
    *FAILED*) checks_failed+=("${line%% *}: ${line#*FAILED: }") ;;
  esac
done <"$out/table.txt"
[ "$table_rc" -eq 0 ] || [ ${#checks_failed[@]} -gt 0 ] || fail "the table's verdict: $(tail -1 "$out/table.txt")"
echo "relayout on $(nvidia-smi -L | head -1), all ranks sharing it, in $(($(date +%s) - t_start)) s" >>"$sum"
( finish ) >"$out/verdict.txt"
verdict=$?
grep -v '^$' "$out/verdict.txt"
echo
cat "$out/table.txt"
exit "$verdict"
