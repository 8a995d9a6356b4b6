#!/usr/bin/env bash
# gpu-ckpt-check.sh: checkpoints that do not stop training, and preemption, on one GPU (docs/CHECKPOINTS.md).
#   stall  llama1b at 32K, 30 steps, a checkpoint every 10, written while training goes on, then the same run with
#          train.async_save = false (the loop waits for each write): every asynchronous save holds the loop (the
#          save's own time, plus what the next step lost: its update's wait for the snapshot, or its time over the
#          median step, the larger) at most 5% of the median step; ckpt_30 of the two runs are the same bytes, file by file (cmp); each write's GB/s and the waiting
#          save's stall are reported beside it. train.keep_checkpoints = 1 keeps one checkpoint (14 GB) per run.
#   kill   tiny, 30 steps, a checkpoint every 10, killed with SIGKILL while ckpt_20 is being written (the test hook
#          CPGEN_CKPT_PAUSE=20:120 holds the writer after the weights): no ckpt_20, its .tmp folder left, `latest`
#          naming ckpt_10; the run resumed from the out_dir starts from ckpt_10, its steps 11-30 have the losses of an
#          uninterrupted run (1e-6 relative; the bits are counted), and its save of ckpt_20 removes the dead writer's
#          folder.
#   stop   tiny as 4 ranks sharing the GPU (--gpus 4 --ranks-per-gpu 4), SIGTERM to one rank mid-run: every rank says
#          it stopped after the same step, the parent exits 75 (CP_EXIT_STOPPED), ckpt_<step> is there; the run
#          resumed from the out_dir continues the uninterrupted run's losses within 1e-3.
# The table comes last. Exit 0 when every check passed, 1 when one failed, 77 when one was skipped (no GPU: nothing
# runs; too little disk for the stall part). The whole check takes about 6-8 minutes on one H200.
# usage: [PARTS="stall kill stop"] tools/gpu-ckpt-check.sh [BUILD_DIR]; logs under $OUT/ckpt-check
set -u
B=${1:-build}
out=${OUT:-out}/ckpt-check
PARTS=${PARTS:-stall kill stop}
rm -rf "$out" && mkdir -p "$out/runs"
. "$(dirname "$0")/check_common.sh" # no GPU: skipped (77) here, before anything runs
[ -x "$B/cpgen" ] || { echo "gpu-ckpt-check: no $B/cpgen: build first (make)"; exit 2; }
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/$B/jitcache} NCCL_NVLS_ENABLE=0
rows="$out/rows.txt" # the table: part | what | measured | bound | verdict
: >"$rows"
row() { printf '%s|%s|%s|%s|%s\n' "$@" >>"$rows"; }
t_start=$SECONDS

# wait_for FILE PATTERN SECONDS PID: until FILE has a line matching PATTERN (0), PID exits or time runs out (1)
wait_for() {
  local t0=$SECONDS
  until grep -qE "$2" "$1" 2>/dev/null; do
    kill -0 "$4" 2>/dev/null || return 1
    [ $((SECONDS - t0)) -lt "$3" ] || return 1
    sleep 0.2
  done
}

# same_files A B: the folders hold the same names, each file the same bytes
same_files() {
  [ -d "$1" ] && [ -d "$2" ] || { echo "missing: $1 or $2"; return 1; }
  local la lb f
  la=$(cd "$1" && ls) lb=$(cd "$2" && ls)
  [ "$la" = "$lb" ] || { echo "other files: $(echo "$la" | tr '\n' ' ') / $(echo "$lb" | tr '\n' ' ')"; return 1; }
  for f in $la; do cmp "$1/$f" "$2/$f" || return 1; done
  echo "$(echo "$la" | wc -w) files, $(du -sb "$1" | cut -f1) bytes, the same"
}

# ---------------------------------------------------------------- stall: llama1b at 32K, async against sync
if want stall; then
  free_gb=$(df -Pk "$out" | awk 'NR == 2 { print int($4 / 1e6) }')
  need_gb=${CKPT_DISK_GB:-48} # tests/test_checks.sh sets 0 for its stand-in
  if [ "$free_gb" -lt "$need_gb" ]; then
    skip "stall: $free_gb GB free under $out; the two runs' checkpoints need $need_gb GB (3 at a time, 14 GB each)"
    row stall "disk" "$free_gb GB free" ">= $need_gb GB" skipped
  else
    l1b=(llama1b --seq 32K --set train.steps=30 --set train.save_every=10 --set train.keep_checkpoints=1
      --set train.log_every=1)
    GREP='done: .*' run stall_async 300 "$B/cpgen" run "${l1b[@]}" --set "train.out_dir=$out/runs/async"
    GREP='done: .*' run stall_sync 400 "$B/cpgen" run "${l1b[@]}" --set train.async_save=false \
      --set "train.out_dir=$out/runs/sync"
    check "stall: each save against the median step" python3 - "$out" "$rows" <<'PY'
import json, re, statistics, sys
out, rows = sys.argv[1], sys.argv[2]
def load(name):
    try:
        return [json.loads(l) for l in open(f"{out}/runs/{name}/metrics.jsonl") if l.strip()]
    except (OSError, ValueError) as e:
        return []
def written(name):
    """ckpt step -> (GB/s, seconds) from the log's 'ckpt_N written: X in Y s, Z GB/s' lines"""
    got = {}
    try:
        for l in open(f"{out}/stall_{name}.log"):
            m = re.search(r"ckpt_(\d+) written: .* in ([\d.]+) s, ([\d.]+) GB/s", l)
            if m: got[int(m.group(1))] = (float(m.group(3)), float(m.group(2)))
    except OSError:
        pass
    return got
a, s = load("async"), load("sync")
wa, ws = written("async"), written("sync")
ok = True
with open(rows, "a") as f:
    if [r["step"] for r in a] != list(range(1, 31)) or [r["step"] for r in s] != list(range(1, 31)):
        print(f"stall: the runs logged steps {[r['step'] for r in a][-1:]} and {[r['step'] for r in s][-1:]}, "
              f"not 1-30 each: FAILED")
        print("stall|runs|cut short|30 steps each|FAILED", file=f)
        sys.exit(1)
    med = statistics.median(r["seconds"] for r in a[1:])
    meds = statistics.median(r["seconds"] for r in s[1:])
    print(f"median step: {med:.3f} s asynchronous, {meds:.3f} s waiting for the writes")
    by = {r["step"]: r for r in a}
    saves = [r for r in a if "ckpt" in r]
    if [r["ckpt"] for r in saves] != [10, 20, 30]:
        print(f"stall: saves at {[r['ckpt'] for r in saves]}, not 10, 20, 30: FAILED")
        ok = False
    for r in saves:
        k = r["ckpt"]
        # what the next step lost: its update's wait on the host for the snapshot, or, where the wait was on the GPU
        # (the copies not done by the update) or the copies slowed it, its time over the median; the larger
        nxt = by.get(k + 1, {})
        wait = max(nxt.get("snapshot_wait", 0.0), nxt.get("seconds", med) - med)
        stall = r["ckpt_held"] + wait
        sync = next((x for x in s if x.get("ckpt") == k), {})
        good = stall <= 0.05 * med
        ok &= good
        gbs, secs = wa.get(k, (float("nan"), float("nan")))
        sgbs = ws.get(k, (float("nan"), 0))[0]
        print(f"ckpt_{k}: held {1e3 * r['ckpt_held']:.1f} ms (of it {r['ckpt_waited']:.2f} s for the previous write) "
              f"+ the next step lost {1e3 * wait:.1f} ms = {100 * stall / med:.2f}% of the median step (<= 5%) "
              f"{'OK' if good else 'FAILED'}; written in {secs:.1f} s at {gbs:.2f} GB/s; the waiting save held "
              f"{sync.get('ckpt_held', float('nan')):.1f} s ({sgbs:.2f} GB/s)")
        print(f"stall|ckpt_{k} held the loop|{1e3 * stall:.1f} ms = {100 * stall / med:.2f}% of {med:.3f} s"
              f"|<= 5%|{'ok' if good else 'FAILED'}", file=f)
        print(f"stall|ckpt_{k} write (sync save's stall)|{secs:.1f} s, {gbs:.2f} GB/s "
              f"({sync.get('ckpt_held', float('nan')):.1f} s)|reported|-", file=f)
sys.exit(0 if ok else 1)
PY
    if msg=$(same_files "$out/runs/async/ckpt_30" "$out/runs/sync/ckpt_30" 2>&1); then
      pass "stall: ckpt_30 asynchronous against waiting: $msg"
      row stall "ckpt_30 async = sync (cmp)" "$msg" "every byte" ok
    else
      fail "stall: ckpt_30 asynchronous against waiting: $msg"
      row stall "ckpt_30 async = sync (cmp)" "$msg" "every byte" FAILED
    fi
    rm -rf "$out/runs/async"/ckpt_* "$out/runs/sync"/ckpt_*
  fi
fi

# ---------------------------------------------------------------- kill: SIGKILL during ckpt_20's write, resume
if want kill; then
  tiny=(tiny --set train.steps=30 --set train.warmup=5 --set train.save_every=10 --set train.log_every=1)
  kdir="$out/runs/kill"
  run kill_ref 180 "$B/cpgen" run "${tiny[@]}" --set "train.out_dir=$out/runs/kill_ref"
  CPGEN_CKPT_PAUSE=20:120 "$B/cpgen" run "${tiny[@]}" --set "train.out_dir=$kdir" >"$out/kill_run.log" 2>&1 &
  pid=$!
  if wait_for "$out/kill_run.log" "CPGEN_CKPT_PAUSE: the writer pauses .* of ckpt_20" 180 "$pid"; then
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    rc=$?
    tmpdirs=$(ls -d "$kdir"/ckpt_20.tmp.* 2>/dev/null | wc -l)
    latest=$(cat "$kdir/latest" 2>/dev/null)
    if [ "$rc" = 137 ] && [ ! -e "$kdir/ckpt_20" ] && [ "$tmpdirs" = 1 ] && [ "$latest" = ckpt_10 ]; then
      pass "kill: killed during ckpt_20's write (exit $rc): no ckpt_20, its .tmp folder left, latest = $latest"
      row kill "killed mid-write" "no ckpt_20, 1 .tmp, latest=$latest" "latest=ckpt_10" ok
    else
      fail "kill: after the kill (exit $rc): ckpt_20 $([ -e "$kdir/ckpt_20" ] && echo exists || echo absent)," \
        "$tmpdirs .tmp folders, latest = '$latest'"
      row kill "killed mid-write" "exit $rc, $tmpdirs .tmp, latest=$latest" "latest=ckpt_10" FAILED
    fi
    run kill_resume 180 "$B/cpgen" run "${tiny[@]}" --set "train.out_dir=$kdir" --resume "$kdir"
    expect kill_resume "^resumed from .*ckpt_10 " "the resumed run did not start from ckpt_10"
    check "kill: resumed losses against the uninterrupted run" python3 - "$out/runs/kill_ref/metrics.jsonl" \
      "$kdir/metrics.jsonl" "$rows" <<'PY'
import json, struct, sys
ref, res, rows = sys.argv[1:4]
def load(f):
    try:
        return {r["step"]: r for r in (json.loads(l) for l in open(f) if l.strip())}
    except (OSError, ValueError):
        return {}
a, b = load(ref), load(res)
steps = list(range(11, 31))
if any(k not in a or k not in b for k in steps):
    print(f"kill: steps 11-30 missing: reference has {len(a)}, resumed {len(b)}: FAILED")
    open(rows, "a").write("kill|resumed losses 11-30|missing steps|1e-6|FAILED\n")
    sys.exit(1)
bits = lambda x: struct.pack("<d", x)
worst = max(abs(b[k]["loss"] - a[k]["loss"]) / abs(a[k]["loss"]) for k in steps)
same = sum(bits(a[k]["loss"]) == bits(b[k]["loss"]) for k in steps)
ok = worst <= 1e-6
print(f"kill: steps 11-30 resumed from ckpt_10: worst relative loss difference {worst:.2e} (<= 1e-6), {same} of 20 "
      f"bit-equal: {'OK' if ok else 'FAILED'}")
open(rows, "a").write(f"kill|resumed losses 11-30|{worst:.1e}, {same}/20 bit-equal|<= 1e-6|{'ok' if ok else 'FAILED'}\n")
sys.exit(0 if ok else 1)
PY
    left=$(ls -d "$kdir"/ckpt_20.tmp.* 2>/dev/null | wc -l)
    if [ "$left" = 0 ] && [ -f "$kdir/ckpt_20/trainer_state.json" ]; then
      pass "kill: the resumed run's ckpt_20 replaced the dead writer's folder"
    else
      fail "kill: after the resumed run, $left ckpt_20.tmp folders and ckpt_20 $([ -d "$kdir/ckpt_20" ] || echo missing)"
    fi
  else
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    fail "kill: the run never paused in ckpt_20's write (log: $out/kill_run.log)"
    row kill "killed mid-write" "never paused" "-" FAILED
  fi
  rm -rf "$out/runs/kill_ref"/ckpt_* "$kdir"/ckpt_*
fi

# ---------------------------------------------------------------- stop: SIGTERM to one of 4 ranks, resume
if want stop; then
  four=(tiny --gpus 4 --ranks-per-gpu 4 --set train.micro_batches=2 --set train.steps=20 --set train.save_every=1000
    --set train.warmup=2 --set train.log_every=1)
  sdir="$out/runs/stop"
  run stop_ref 240 "$B/cpgen" run "${four[@]}" --set "train.out_dir=$out/runs/stop_ref"
  "$B/cpgen" run "${four[@]}" --set "train.out_dir=$sdir" >"$out/stop_run.log" 2>&1 &
  parent=$!
  if wait_for "$out/stop_run.log" "^step 6/" 240 "$parent"; then
    victim=$(pgrep -P "$parent" -f ' run ' | tail -1) # a rank: the parent's children are its ranks
    kill -TERM "$victim"
    t0=$SECONDS
    ( sleep 240; kill -9 "$parent" 2>/dev/null ) &
    guard=$!
    wait "$parent"
    rc=$?
    kill "$guard" 2>/dev/null
    n=$(sed -nE 's/^stopped by SIGTERM after step ([0-9]+): saved ckpt_\1; continue with --resume .*/\1/p' \
      "$out/stop_run.log" | head -1)
    ranks=$(grep -cE "^cpgen: rank [0-3]: stopped in order after step ${n:-x}\$" "$out/stop_run.log")
    steps=$(grep -oE "^cpgen: rank [0-3]: stopped in order after step [0-9]+" "$out/stop_run.log" |
      awk '{print $NF}' | sort -u | tr '\n' ' ')
    if [ "$rc" = 75 ] && [ -n "$n" ] && [ "$ranks" = 4 ] && [ -f "$sdir/ckpt_$n/trainer_state.json" ] &&
      grep -q "4 of 4 ranks stopped in order (exit 75)" "$out/stop_run.log"; then
      pass "stop: SIGTERM to pid $victim: every rank stopped after step $n, exit $rc in $((SECONDS - t0)) s"
      row stop "SIGTERM to one rank" "4 ranks after step $n, exit $rc" "same step, exit 75" ok
    else
      fail "stop: SIGTERM to pid $victim: exit $rc, rank-0 line for step '${n:-none}', ranks stopping after steps" \
        "'$steps' ($ranks at step ${n:-?}) (log: $out/stop_run.log)"
      row stop "SIGTERM to one rank" "exit $rc, steps '$steps'" "same step, exit 75" FAILED
    fi
    if [ -n "$n" ]; then
      run stop_resume 240 "$B/cpgen" run "${four[@]}" --set "train.out_dir=$sdir" --resume "$sdir"
      if compare_loss "stop: resumed from ckpt_$n against uninterrupted" "$out/runs/stop_ref/metrics.jsonl" \
        "$sdir/metrics.jsonl" 20 $((n + 1)); then
        row stop "resumed losses $((n + 1))-20" "within 1e-3" "<= 1e-3" ok
      else
        row stop "resumed losses $((n + 1))-20" "over 1e-3 or missing" "<= 1e-3" FAILED
      fi
    fi
  else
    kill -9 "$parent" 2>/dev/null
    pkill -9 -P "$parent" 2>/dev/null
    wait "$parent" 2>/dev/null
    fail "stop: the run never reached step 6 (log: $out/stop_run.log)"
    row stop "SIGTERM to one rank" "never reached step 6" "-" FAILED
  fi
  rm -rf "$out/runs/stop_ref"/ckpt_* "$sdir"/ckpt_*
fi

# ---------------------------------------------------------------- the verdict, the table last
echo
for f in ${checks_failed[@]+"${checks_failed[@]}"}; do echo "FAILED   $f"; done
for f in ${checks_skipped[@]+"${checks_skipped[@]}"}; do echo "skipped  $f"; done
[ "$checks_passed" -gt 0 ] || [ ${#checks_failed[@]} -gt 0 ] || [ ${#checks_skipped[@]} -gt 0 ] ||
  { checks_failed+=("nothing was checked (PARTS=\"$PARTS\")"); echo "FAILED   nothing was checked"; }
echo "$(basename "$0"): $checks_passed passed, ${#checks_failed[@]} failed, ${#checks_skipped[@]} skipped in" \
  "$((SECONDS - t_start)) s (summary: $sum)"
echo
printf '%-6s %-38s %-44s %-16s %s\n' part check measured bound result
while IFS='|' read -r p w m b v; do printf '%-6s %-38s %-44s %-16s %s\n' "$p" "$w" "$m" "$b" "$v"; done <"$rows"
[ ${#checks_failed[@]} -eq 0 ] || exit 1
[ ${#checks_skipped[@]} -eq 0 ] || exit 77
exit 0
