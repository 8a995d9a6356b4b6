#!/usr/bin/env bash
# gpu-layouts-check.sh: every layout of several ranks, run on the GPUs at hand with ranks sharing them
# (`cpgen run --ranks-per-gpu K`: each rank its own NCCL host, talking over sockets), against one GPU doing the same
# work: the same sequences per step (R replicas x M micro-batches against one GPU's R x M micro-batches).
# For each layout (tiny with 2 sequences per step unless said; tiny8 is tiny with 8 query heads and 2 KV heads; l8b
# is 2 layers of the 8B shape at 32K):
#   - N steps (tiny 20, l8b 3): every step's loss within 1e-3 and gradient norm within 1e-2 (relative) of the
#     one-GPU run;
#   - its checkpoint (tiny: step 10, l8b: step 1) resumed to step N: every step within 1e-3 of the run that was
#     not stopped (tiny: the layout's own 20 steps; l8b: the one-GPU run, below);
#   - memory: every rank's own GPU memory (per process) within 1% of the plan's peak, at every step after the first.
# Ranks sharing a GPU take turns on it (the GPU time-slices their contexts), and their collectives go through
# sockets: tiny runs 2 sequences per step rather than 8. A step of the 8B shape's 8 ranks moves ~100 GB through
# them (FSDP's gathers of 1.5 billion parameters, most of them the embedding and the LM head) and takes ~20 s
# alone, and its checkpoint is 18 GB, so l8b runs 3 steps as 1 + 2: the first run stops at step 1 with its
# checkpoint, the second resumes it to step 3 (step 2 reads the saved weights, step 3 the saved moments too), and
# both are held to the one-GPU run of 3 steps (a constant learning rate from the first step, so that the schedule
# does not depend on train.steps). Its checkpoints go to /dev/shm when it has room (the disk writes ~0.5 GB/s).
# The 8B layouts run in their own lane beside the tiny ones (its one-GPU reference beside its first layout), so
# that the whole check fits one call of ten minutes.
# For each kind of layout (Ulysses, replicas, ring, ring x Ulysses, replicas x Ulysses, replicas x ring), one rank
# killed mid-step under launcher variables (no parent watching): every other rank exits non-zero within 30 s, and
# its last words name the rank that died.
# The table comes last; the exit status is 0 only when every case passed (77: no GPU, nothing ran).
# DEADLINE (seconds, default 560): no run starts after it, and each run's limit ends there, so the table always
# comes (a case cut short fails).
# usage: [CASES="name ..."] [LAYOUT_SETS=...] [JOBS=3] [DEADLINE=560] tools/gpu-layouts-check.sh [BUILD_DIR]; logs under
# $OUT/layouts-check
set -u
B=${1:-build}
out=${OUT:-out}/layouts-check
rm -rf "$out" && mkdir -p "$out/runs" "$out/res"
. "$(dirname "$0")/check_common.sh" # no GPU: skipped (77) here, before anything runs
[ -x "$B/cpgen" ] || { echo "gpu-layouts-check: no $B/cpgen: build first (make)"; exit 2; }
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
JOBS=${JOBS:-3}
set_deadline "${DEADLINE:-560}" # left, run_case: check_common.sh

steps=(--set train.log_every=1)
mb2=(--set train.micro_batches=2)
tiny8=(--set model.heads=8 --set model.kv_heads=2 "${mb2[@]}")
l8b=(--set model.layers=2 --seq 32K --set train.lr=3e-4 --set train.min_lr=3e-4)
steps_of() { [[ $1 == l8b* ]] && echo 3 || echo 20; } # steps of a case
warmup_of() { [[ $1 == l8b* ]] && echo 0 || echo 2; }
saved_at() { [[ $1 == l8b* ]] && echo 1 || echo 10; } # its checkpoint, resumed to the last step

# name | kind | spec and sets of the layout | reference
# The reference is the same spec on one GPU (parallel.gpus=1, no replicas or ring) with the same sequences per step.
tiny="tiny ${mb2[*]}"
one="--set train.micro_batches=1" # a replica's share of the 2 sequences
cases=(
  "ulysses2|ulysses|$tiny --gpus 2|tiny"
  "ulysses4_kv2|ulysses|$tiny --gpus 4|tiny"
  "ulysses8_kv2|ulysses|tiny ${tiny8[*]} --gpus 8|tiny8"
  "upipe2|ulysses|tiny ${tiny8[*]} --gpus 2 --set parallel.upipe_heads=2|tiny8"
  "upipe4|ulysses|tiny ${tiny8[*]} --gpus 2 --set parallel.upipe_heads=4|tiny8"
  "upipe_auto|ulysses|tiny ${tiny8[*]} --gpus 2 --set parallel.upipe_heads=auto|tiny8"
  "optimizer_host|ulysses|$tiny --gpus 2 --set parallel.optimizer=host|tiny"
  "offload_all|ulysses|$tiny --gpus 2 --set parallel.offload=all|tiny"
  "attn_gpu|ulysses|$tiny --gpus 2 --set parallel.attention_output=gpu|tiny"
  "attn_host|ulysses|$tiny --gpus 2 --set parallel.attention_output=host|tiny"
  "attn_recompute|ulysses|$tiny --gpus 2 --set parallel.attention_output=recompute|tiny"
  "replicas2|replicas|tiny --set parallel.gpus=1 --set parallel.replicas=2 $one|tiny"
  "replicas2_ulysses2|replicas_ulysses|tiny --gpus 2 --set parallel.replicas=2 $one|tiny"
  "ring2_u1|ring|$tiny --set parallel.gpus=1 --set parallel.ring=2 --set parallel.upipe_heads=1|tiny"
  "ring2_u2|ring|$tiny --set parallel.gpus=1 --set parallel.ring=2 --set parallel.upipe_heads=2|tiny"
  "ring4_u1|ring|$tiny --set parallel.gpus=1 --set parallel.ring=4 --set parallel.upipe_heads=1|tiny"
  "ring4_u2|ring|$tiny --set parallel.gpus=1 --set parallel.ring=4 --set parallel.upipe_heads=2|tiny"
  "ring2_ulysses2|ring_ulysses|$tiny --gpus 2 --set parallel.ring=2|tiny"
  "replicas2_ring2|replicas_ring|tiny --set parallel.gpus=1 --set parallel.replicas=2 --set parallel.ring=2 $one|tiny"
  "l8b_ulysses8|ulysses|llama8b ${l8b[*]} --gpus 8|l8b"
  "l8b_ring2x4|ring_ulysses|llama8b ${l8b[*]} --gpus 4 --set parallel.ring=2|l8b"
)
declare -A refs=([tiny]="$tiny --gpus 1" [tiny8]="tiny ${tiny8[*]} --gpus 1" [l8b]="llama8b ${l8b[*]} --gpus 1")
# one rank of each kind killed mid-step: name | layout
kills=(
  "kill_ulysses|$tiny --gpus 4"
  "kill_replicas|tiny --set parallel.gpus=1 --set parallel.replicas=2 $one"
  "kill_ring|$tiny --set parallel.gpus=1 --set parallel.ring=2 --set parallel.upipe_heads=1"
  "kill_ring_ulysses|$tiny --gpus 2 --set parallel.ring=2"
  "kill_replicas_ulysses|tiny --gpus 2 --set parallel.replicas=2 $one"
  "kill_replicas_ring|tiny --set parallel.gpus=1 --set parallel.replicas=2 --set parallel.ring=2 $one"
)
want() { [ -z "${CASES:-}" ] || [[ " $CASES " == *" $1 "* ]]; }
# LAYOUT_SETS="--set key=value ...": overrides added to every layout, its reference and the kills alike (e.g.
# "--set data.source=synthetic:packed": each layout on packed documents against one GPU on the same ones)
if [ -n "${LAYOUT_SETS:-}" ]; then
  for i in "${!cases[@]}"; do
    IFS='|' read -r name kind args ref <<<"${cases[$i]}"
    cases[i]="$name|$kind|$args $LAYOUT_SETS|$ref"
  done
  for key in "${!refs[@]}"; do refs[$key]="${refs[$key]} $LAYOUT_SETS"; done
  for i in "${!kills[@]}"; do kills[i]="${kills[$i]} $LAYOUT_SETS"; done
fi

# The ranks of a plan: replicas x ring x gpus, from its JSON (world is there only for runs of several groups).
world_of() {
  # shellcheck disable=SC2086
  "$B/cpgen" plan $1 --json 2>/dev/null | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p.get("groups", {}).get("world", p["parallel"]["gpus"]))'
}


# A reference: the one-GPU run.
reference() {
  local key=$1 t=120
  [ "$key" = l8b ] && t=300
  # shellcheck disable=SC2086
  run_case "ref_$key" $t ${refs[$key]} "${steps[@]}" --set train.warmup="$(warmup_of "$key")" \
    --set train.steps="$(steps_of "$key")" \
    --set "train.out_dir=$out/runs/ref_$key"
}

# Where the 8B shape's 18 GB checkpoints go: /dev/shm when it has room for two, else beside the logs.
big=$out/runs
if [ "$(df -B1 --output=avail /dev/shm 2>/dev/null | tail -1)" -gt $((48 << 30)) ] 2>/dev/null; then
  big=/dev/shm/cpgen-layouts-check.$$
  mkdir -p "$big" && trap 'rm -rf "$big"' EXIT
fi

# A layout: tiny runs 20 steps with a checkpoint at step 10, then resumes that checkpoint to step 20; l8b runs 2
# steps and saves, then resumes that checkpoint to step 4 (see the top).
layout() {
  local name=$1 args=$2 t=180 world n k; world=$(world_of "$args"); n=$(steps_of "$name"); k=$(saved_at "$name")
  local them=(--ranks-per-gpu "$world" "${steps[@]}" --set train.warmup="$(warmup_of "$name")") dir=$out/runs
  if [[ $name == l8b* ]]; then
    t=300 dir=$big
    # shellcheck disable=SC2086
    run_case "$name" $t $args "${them[@]}" --set train.steps="$k" --set train.save_every="$k" \
      --set "train.out_dir=$dir/$name"
    cp "$dir/$name/metrics.jsonl" "$out/runs/$name.metrics.jsonl" 2>/dev/null
  else
    # shellcheck disable=SC2086
    run_case "$name" $t $args "${them[@]}" --set train.steps="$n" --set train.save_every="$k" \
      --set "train.out_dir=$dir/$name"
    rm -rf "$dir/$name/ckpt_$n" # the uninterrupted run's last checkpoint is not needed
  fi
  # shellcheck disable=SC2086
  run_case "${name}_resume" $t $args "${them[@]}" --set train.steps="$n" --set train.save_every=0 \
    --set "train.out_dir=$out/runs/${name}_resume" --resume "$dir/$name/ckpt_$k"
  rm -rf "$dir/$name"/ckpt_* "$out/runs/${name}_resume"/ckpt_*
}

# One rank killed mid-step: ranks started as a launcher would start them (no parent watching them), the last rank
# killed with SIGKILL once rank 0 has logged step 3; each other rank's exit code and seconds after the kill.
# PORT: MASTER_PORT, below Linux's ephemeral ports (32768 and up), where NCCL's own sockets and those of the other
# runs of this check come and go (a kill test once lost its port to one of them); distinct for the two run at once.
kill_one() {
  local name=$1 args=$2 port=$3
  local world; world=$(world_of "$args")
  local pids=() r
  for r in $(seq 0 $((world - 1))); do
    # exec: the pid is the rank's own, which the kill below must reach
    # shellcheck disable=SC2086
    (export RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
     exec "$B/cpgen" run $args --ranks-per-gpu "$world" --set train.steps=100000 --set train.warmup=5 \
       --set train.log_every=1 --set "train.out_dir=$out/runs/$name" >"$out/${name}_rank$r.log" 2>&1) &
    pids+=($!)
  done
  local victim=$((world - 1)) waited=0
  until grep -q "^step 3/" "$out/${name}_rank0.log" 2>/dev/null || [ $waited -ge 900 ]; do
    sleep 0.1; waited=$((waited + 1))
  done
  local t0; t0=$(date +%s.%N)
  kill -9 "${pids[$victim]}" 2>/dev/null
  : >"$out/res/$name.kill"
  # the others get 30 s to stop by themselves (and 5 more before they are killed, which fails the case)
  local r
  ( sleep 35; for r in "${pids[@]}"; do kill -9 "$r" 2>/dev/null; done ) &
  local guard=$!
  for r in $(seq 0 $((world - 1))); do
    [ "$r" = "$victim" ] && continue
    wait "${pids[$r]}"
    local rc=$?
    echo "$r $rc $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")" >>"$out/res/$name.kill"
  done
  kill "$guard" 2>/dev/null
  wait "${pids[$victim]}" 2>/dev/null
  echo "$victim" >"$out/res/$name.victim"
  [ $waited -lt 900 ] || echo "never reached step 3 (rank 0: $(grep -m1 '^cpgen:' "$out/${name}_rank0.log"))" \
    >"$out/res/$name.note"
  echo "  [$(($(date +%s) - t_start)) s] $name: done"
}

# Two lanes from the start: the 8B shape's reference and layouts one after another (8 ranks of it and 18 GB
# checkpoints: one at a time), and beside them the tiny references, the tiny layouts JOBS at a time, then the kills
# two at a time.
uses() { # uses KEY: whether a wanted case has reference KEY
  local c name kind args ref
  for c in "${cases[@]}"; do
    IFS='|' read -r name kind args ref <<<"$c"
    want "$name" && [ "$ref" = "$1" ] && return 0
  done
  return 1
}
lane_8b() {
  uses l8b || return 0
  reference l8b &
  local c name kind args ref
  for c in "${cases[@]}"; do
    IFS='|' read -r name kind args ref <<<"$c"
    want "$name" && [[ $name == l8b* ]] && layout "$name" "$args"
  done
  wait
}
lane_tiny() {
  local key c name kind args ref k
  for key in tiny tiny8; do uses $key && reference $key & done
  wait
  for c in "${cases[@]}"; do
    IFS='|' read -r name kind args ref <<<"$c"
    want "$name" && [[ $name != l8b* ]] || continue
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    layout "$name" "$args" &
  done
  wait
  local base=$((20000 + RANDOM % 1200 * 10)) i=0
  for k in "${kills[@]}"; do
    IFS='|' read -r name args <<<"$k"
    i=$((i + 1))
    want "$name" || continue
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
    [ "$(left)" -gt 60 ] || { echo "  $name: not started (deadline)"; continue; }
    kill_one "$name" "$args" $((base + i)) &
  done
  wait
}
# each lane a subshell of its own: a lane's `wait` and `jobs` then see its own runs only, not the other lane
lane_8b &
lane_tiny &
wait

printf '%s\n' "${cases[@]}" >"$out/cases.txt"
printf '%s\n' "${kills[@]}" >"$out/kills.txt"
python3 - "$out" "${CASES:-}" "$(($(date +%s) - t_start))" <<'PY'
import json, os, re, sys
out, only, wall = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def metrics(name):
    p = f"{out}/runs/{name}/metrics.jsonl"
    if not os.path.exists(p): p = f"{out}/runs/{name}.metrics.jsonl" # a run whose folder was elsewhere
    if not os.path.exists(p): return []
    rows = []
    for line in open(p):
        try: rows.append(json.loads(line))
        except ValueError: pass
    return rows
def rc(name):
    try: a, s = open(f"{out}/res/{name}.rc").read().split(); return int(a), int(s)
    except (OSError, ValueError): return None, 0
def last_words(name):
    try: lines = [l for l in open(f"{out}/{name}.log") if l.startswith("cpgen:")]
    except OSError: return "no log"
    return lines[-1].strip()[:240] if lines else "no message"
rows, failed = [], 0
for c in open(f"{out}/cases.txt").read().splitlines():
    name, kind, args, ref = c.split("|")
    if only and name not in only: continue
    why = []
    a, b, res = metrics(f"ref_{ref}"), metrics(name), metrics(f"{name}_resume")
    r0, t0 = rc(f"ref_{ref}"); r1, t1 = rc(name); r2, t2 = rc(f"{name}_resume")
    for n, r in ((f"ref_{ref}", r0), (name, r1), (f"{name}_resume", r2)):
        if r != 0: why.append(f"{n} exited {r}: {last_words(n)}")
    split = name.startswith("l8b") # 1 step, then resumed to 3: the layout's steps are both runs'
    n, k = (3, 1) if split else (20, 10)
    if split: b = b + res
    ok_steps = [s["step"] for s in a] == list(range(1, n + 1)) and [s["step"] for s in b] == list(range(1, n + 1))
    if not ok_steps: why.append(f"steps: reference {len(a)}, layout {len(b)} of {n}")
    bs = {s["step"]: s for s in b}
    base = {s["step"]: s for s in (a if split else b)} # the run that was not stopped: l8b's is the one-GPU run
    lrel = max((abs(s["loss"] - bs[s["step"]]["loss"]) / abs(s["loss"]) for s in a if s["step"] in bs), default=float("nan"))
    nrel = max((abs(s["norm"] - bs[s["step"]]["norm"]) / abs(s["norm"]) for s in a if s["step"] in bs), default=float("nan"))
    if not lrel <= 1e-3: why.append(f"loss {lrel:.2e} > 1e-3")
    if not nrel <= 1e-2: why.append(f"norm {nrel:.2e} > 1e-2")
    rs = {s["step"]: s for s in res}
    if sorted(rs) != list(range(k + 1, n + 1)): why.append(f"resume: steps {sorted(rs)} not {k + 1}-{n}")
    rrel = max((abs(rs[k]["loss"] - base[k]["loss"]) / abs(base[k]["loss"]) for k in rs if k in base), default=float("nan"))
    if not rrel <= 1e-3: why.append(f"resume loss {rrel:.2e} > 1e-3")
    mem = [(s["mem_measured"], s.get("mem_measured_min", s["mem_measured"]), s["mem_planned"], s.get("mem_own", True))
           for s in b if s["step"] > 1 and not (split and s["step"] == k + 1)] # each run's first step aside
    mhi = max((abs(x - p) / p for x, _, p, _ in mem), default=float("nan"))
    mlo = max((abs(y - p) / p for _, y, p, _ in mem), default=float("nan"))
    if not all(o for *_, o in mem): why.append("memory: not measured per process")
    if not max(mhi, mlo) <= 0.01: why.append(f"memory {100 * max(mhi, mlo):.2f}% from the plan > 1%")
    planned = mem[-1][2] / 2**30 if mem else float("nan")
    ms = f"{mem[-1][1] / 2**30:.3f}-{mem[-1][0] / 2**30:.3f}/{planned:.3f}" if mem else "-"
    failed += bool(why)
    rows.append((name, f"{lrel:.1e}", f"{nrel:.1e}", f"{rrel:.1e}", ms, f"{t1 + t2}", "ok" if not why else "FAILED: " + "; ".join(why)))
for k in open(f"{out}/kills.txt").read().splitlines():
    name, args = k.split("|")
    if only and name not in only: continue
    why = []
    try: victim = int(open(f"{out}/res/{name}.victim").read())
    except (OSError, ValueError): victim = None; why.append("did not run")
    if os.path.exists(f"{out}/res/{name}.note"): why.append(open(f"{out}/res/{name}.note").read().strip())
    worst = 0.0
    try: lines = open(f"{out}/res/{name}.kill").read().split("\n")
    except OSError: lines = []
    for l in filter(None, lines):
        r, code, secs = l.split(); secs = float(secs); worst = max(worst, secs)
        if code == "0": why.append(f"rank {r} exited 0")
        if secs > 30: why.append(f"rank {r} took {secs:.0f} s")
        words = [x for x in open(f"{out}/{name}_rank{r}.log") if x.startswith("cpgen:")]
        if not words or f"rank {victim}" not in words[-1]: why.append(f"rank {r} does not name rank {victim}: {words[-1].strip()[:200] if words else 'no message'}")
    failed += bool(why)
    rows.append((name, "-", "-", "-", "-", f"{worst:.1f}", "ok" if not why else "FAILED: " + "; ".join(why)))
print(f"\nlayouts on {os.popen('nvidia-smi -L | head -1').read().strip()}, all ranks sharing it, in {wall} s")
print(f"{'case':22} {'loss':>8} {'norm':>8} {'resume':>8} {'GiB min-max/plan':>22} {'s':>5}  result")
for r in rows: print(f"{r[0]:22} {r[1]:>8} {r[2]:>8} {r[3]:>8} {r[4]:>22} {r[5]:>5}  {r[6]}")
print(f"{len(rows) - failed} of {len(rows)} passed")
with open(f"{out}/table.txt", "w") as f:
    for r in rows: print("\t".join(r), file=f)
sys.exit(1 if failed or not rows else 0)
PY
