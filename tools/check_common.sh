# check_common.sh: what the GPU check scripts share; sourced after they set $out (the folder of their logs) and,
# where they have parts, $PARTS. It counts every check they make and ends them with one verdict, so that a check
# script fails when a check fails.
#
# Exit status of a check script (and of a GPU test binary), as automake counts tests:
#   0   every check ran and passed;
#   1   a check failed (a command's non-zero exit, a time limit, a bound missed, a run cut short, a file missing);
#   77  skipped: nothing failed, but something could not run on this machine (no GPU, too few GPUs, the wrong
#       architecture), so the script proved less than it says. A GPU test that cannot run prints one line holding
#       "skipped" and why, and exits 77 (tests/gpu/gpu_util.h gu_skip); `run` below counts that as a skip.
# A machine without a GPU (nvidia-smi missing, failing, or listing none) makes the sourcing script print
# "<script>: skipped: no GPU (why)" and exit 77 here, before it runs anything.
#
# Helpers:
#   gpus                     the number of GPUs nvidia-smi lists
#   want PART                is PART among $PARTS
#   need_gpus N WHAT         true when this machine has N GPUs; else WHAT is recorded as skipped
#   note TEXT                print TEXT and add it to $out/summary.txt ($sum)
#   pass [TEXT] / fail TEXT / skip TEXT   record a check passed, failed or skipped, noting TEXT
#   run NAME TIMEOUT COMMAND...   run COMMAND under a time limit (then SIGKILL 30 s later) into $out/NAME.log (with
#                            SHOW=1 on the terminal too) and note its exit status, seconds and, when GREP is set, the
#                            first match of that pattern in the log; exit 0 passes, 77 is a skip (with the log's line
#                            saying why; without it, a failure), anything else fails (124 or 137: the time limit);
#                            returns COMMAND's exit status
#   check NAME COMMAND...    run COMMAND (a command or a function, e.g. `python3 - ARGS <<'PY'` holding a bound: it
#                            must exit non-zero when the bound is missed) with its stdout into the summary; its exit
#                            status counts as run's
#   expect NAME PATTERN [WHAT]   fail unless $out/NAME.log has a line matching PATTERN (grep -E)
#   compare A B STEPS [FROM] two runs' metrics.jsonl: each file must hold steps FROM (default 1) to STEPS, each once and
#                            in order (earlier steps are ignored, later ones fail: a run cut short or run on must not
#                            pass); every step's loss within 1e-3 and gradient norm within 1e-2 relative, and B's
#                            measured GPU peak within 1% of its plan
#   compare_loss WHAT A B STEPS [FROM]   the same steps, the loss only (within 1e-3 relative); WHAT names it
#   finish                   print the failures and skips and exit 1 when a check failed, 77 when one was skipped (or
#                            none was made: PARTS named nothing), else 0; every script ends with it
# For scripts that judge their cases in a table of their own at the end (the layout and relayout checks):
#   set_deadline SECONDS     t_start now, and a deadline SECONDS later; `left` prints the seconds left
#   run_case NAME TIMEOUT ARGS...   one `cpgen run ARGS` into $out/NAME.log, within TIMEOUT and the deadline (not
#                            started within 5 s of it), its exit status and seconds in $out/res/NAME.rc (the script
#                            makes $out/res; 124: cut by time or not started); counts nothing itself
# A new check script: `set -u`, B=${1:-build}, out=${OUT:-out}/NAME, mkdir -p "$out", PARTS=${PARTS:-...}, then
# `. "$(dirname "$0")/check_common.sh"`; per part `if want P && need_gpus N P; then run ...; compare ...; fi`, each
# bound it tests inline through check or fail; `finish` last.
# Arrays are written ${a[@]+"${a[@]}"} where they may be empty: set -u on bash before 4.4 calls those unbound.

gpus=0
if ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu_why="nvidia-smi not found"
else
  gpu_list=$(nvidia-smi -L 2>&1)
  gpus=$(grep -c '^GPU [0-9]' <<<"$gpu_list")
  gpu_why="nvidia-smi -L lists none: $(head -1 <<<"$gpu_list")"
fi
if [ "$gpus" -eq 0 ]; then
  echo "$(basename "$0"): skipped: no GPU ($gpu_why)"
  exit 77
fi

sum="$out/summary.txt"
: >"$sum"
checks_passed=0
checks_failed=()
checks_skipped=()

want() { [[ " ${PARTS:-} " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$sum"; }
pass() { checks_passed=$((checks_passed + 1)); [ $# -eq 0 ] || note "$*"; }
fail() { checks_failed+=("$*"); note "FAILED: $*"; }
skip() { checks_skipped+=("$*"); note "skipped: $*"; }
need_gpus() { # N WHAT
  [ "$gpus" -ge "$1" ] && return 0
  skip "$2 (needs $1 GPUs, this machine has $gpus)"
  return 1
}

# _status NAME RC LOG TIMEOUT DETAIL: count a command's exit status as run and check do, DETAIL saying more about a
# failure; a 77 is a skip only with the line that says why (a command that exits 77 for another reason must not pass
# for a skip)
_status() {
  local why
  why=$(grep 'skipped' "$3" 2>/dev/null | tail -1)
  case $2 in
    0) pass ;;
    77) if [ -n "$why" ]; then checks_skipped+=("$1: ${why#*skipped: }"); else
      checks_failed+=("$1: exit status 77 without a line saying skipped$5"); fi ;;
    124 | 137) checks_failed+=("$1: killed by its time limit ($4 s)$5") ;;
    *) checks_failed+=("$1: exit status $2$5") ;;
  esac
}

run() {
  local name=$1 t=$2 rc t0=$SECONDS
  shift 2
  if [ "${SHOW:-0}" = 1 ]; then
    timeout -k 30 "$t" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
  else
    timeout -k 30 "$t" "$@" >"$out/$name.log" 2>&1
    rc=$?
  fi
  note "$(printf '%-22s rc=%-3d %5d s  %s' "$name" "$rc" $((SECONDS - t0)) \
    "$(grep -m1 -oE "${GREP:-x^}" "$out/$name.log")")"
  _status "$name" "$rc" "$out/$name.log" "$t" " (log: $out/$name.log)"
  return "$rc"
}

check() {
  local name=$1 rc tmp
  shift
  tmp=$(mktemp)
  "$@" | tee "$tmp" | tee -a "$sum" # stderr (a traceback) stays on the terminal, or where the caller sends it
  rc=${PIPESTATUS[0]}
  _status "$name" "$rc" "$tmp" - ": $(tail -1 "$tmp")"
  rm -f "$tmp"
  return "$rc"
}

expect() { # NAME PATTERN [WHAT]
  if grep -qE "$2" "$out/$1.log" 2>/dev/null; then
    pass
  else
    fail "$1: ${3:-no line matching \"$2\"} (in $out/$1.log)"
  fi
}

# _metrics MODE WHAT A B STEPS FROM: the comparison behind compare and compare_loss; exits 1 when it fails
_metrics() {
  python3 - "$@" <<'PY'
import json, math, sys
mode, what, fa, fb = sys.argv[1:5]
last, first = int(sys.argv[5]), int(sys.argv[6])

def load(f):
    """The file's steps first..last, or None and why not."""
    try:
        rows = [json.loads(l) for l in open(f) if l.strip()]
    except (OSError, ValueError) as e:
        return None, f"{f}: {e}"
    rows = [r for r in rows if isinstance(r.get("step"), int) and r["step"] >= first]
    steps = [r["step"] for r in rows]
    if steps != list(range(first, last + 1)):
        have = f"steps {steps[0]}-{steps[-1]} in {len(steps)} lines" if steps else "none of them"
        return None, f"{f}: {have}, not each of steps {first}-{last} once"
    return rows, None

def rel(x, ref):
    """|x - ref| / |ref|; inf where either is missing or not finite, so that it fails every bound."""
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (x, ref)):
        return math.inf
    return abs(x - ref) / abs(ref) if ref else (0.0 if x == ref else math.inf)

(a, ea), (b, eb) = load(fa), load(fb)
if ea or eb:
    print(f"{what}: FAILED: {'; '.join(e for e in (ea, eb) if e)}")
    sys.exit(1)
lrel = max(rel(y["loss"], x["loss"]) for x, y in zip(a, b))
if mode == "loss":
    ok = lrel <= 1e-3
    f = lambda v: f"{v:.6f}" if isinstance(v, (int, float)) else str(v)
    print(f"{what}, steps {first}-{last}: step {first} {f(a[0]['loss'])} / {f(b[0]['loss'])}, step {last} "
          f"{f(a[-1]['loss'])} / {f(b[-1]['loss'])}, worst relative difference {lrel:.2e} (<= 1e-3) "
          f"{'OK' if ok else 'FAILED'}")
else:
    nrel = max(rel(y["norm"], x["norm"]) for x, y in zip(a, b))
    mem = max(rel(r.get("mem_measured"), r.get("mem_planned")) for r in b)
    ok = lrel <= 1e-3 and nrel <= 1e-2 and mem <= 0.01
    print(f"{fb} against {fa}, steps {first}-{last}: loss {lrel:.2e} (<= 1e-3), norm {nrel:.2e} (<= 1e-2) relative; "
          f"memory {100 * mem:.2f}% from the plan (<= 1%) {'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
}

compare() { # A B STEPS [FROM]
  check "compare ${2#"$out"/}" _metrics all "compare" "$1" "$2" "$3" "${4:-1}"
}

compare_loss() { # WHAT A B STEPS [FROM]
  check "$1" _metrics loss "$1" "$2" "$3" "$4" "${5:-1}"
}

set_deadline() {
  t_start=$(date +%s)
  deadline=$((t_start + $1))
}
left() { echo $((deadline - $(date +%s))); }
run_case() {
  local name=$1 t=$2; shift 2
  local t0 l; t0=$(date +%s); l=$(left)
  [ "$t" -le "$l" ] || t=$l
  if [ "$t" -le 5 ]; then echo "124 0" >"$out/res/$name.rc"; echo "  $name: not started (deadline)"; return 124; fi
  timeout -k 10 "$t" "$B/cpgen" run "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$rc $(($(date +%s) - t0))" >"$out/res/$name.rc"
  echo "  [$(($(date +%s) - t_start)) s] $name: exit $rc after $(($(date +%s) - t0)) s"
  return $rc
}

finish() {
  [ "$checks_passed" -gt 0 ] || [ ${#checks_failed[@]} -gt 0 ] || [ ${#checks_skipped[@]} -gt 0 ] ||
    fail "nothing was checked (PARTS=\"${PARTS:-}\")"
  echo
  local f
  for f in ${checks_failed[@]+"${checks_failed[@]}"}; do echo "FAILED   $f"; done
  for f in ${checks_skipped[@]+"${checks_skipped[@]}"}; do echo "skipped  $f"; done
  echo "$(basename "$0"): $checks_passed passed, ${#checks_failed[@]} failed, ${#checks_skipped[@]} skipped" \
    "(summary: $sum)"
  [ ${#checks_failed[@]} -eq 0 ] || exit 1
  [ ${#checks_skipped[@]} -eq 0 ] || exit 77
  exit 0
}
