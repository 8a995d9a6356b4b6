# check_common.sh: what the GPU check scripts share; sourced after they set $out and $PARTS.
# want PART: is PART among $PARTS. note TEXT: print and add to $out/summary.txt. run NAME TIMEOUT COMMAND...: run
# under a time limit into $out/NAME.log and note its exit status, seconds and, when GREP is set, the first match
# of that pattern in the log. compare A B [FROM]: two runs' metrics.jsonl against each other (see below).
sum="$out/summary.txt"
: >"$sum"
want() { [[ " $PARTS " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$sum"; }
run() {
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout "$t" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-22s rc=%-3d %5d s  %s' "$name" "$rc" $(($(date +%s) - t0)) \
    "$(grep -m1 -oE "${GREP:-x^}" "$out/$name.log")")"
}

# compare A B [FROM]: losses and norms of two metrics files, steps FROM.. (1-based), and B's memory against its plan
compare() {
  python3 - "$@" <<'PY' | tee -a "$sum"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
first = int(sys.argv[3]) if len(sys.argv) > 3 else 1
a = [r for r in a if r["step"] >= first]
b = [r for r in b if r["step"] >= first]
assert len(a) == len(b) > 0, f"{len(a)} against {len(b)} steps"
lrel = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
nrel = max(abs(x["norm"] - y["norm"]) / abs(x["norm"]) for x, y in zip(a, b))
mem = max(abs(r["mem_measured"] - r["mem_planned"]) / r["mem_planned"] for r in b)
ok = lrel <= 1e-3 and nrel <= 1e-2 and mem <= 0.01
print(f"{sys.argv[2]} against {sys.argv[1]}, steps {first}-{a[-1]['step']}: loss {lrel:.2e} (<= 1e-3), norm "
      f"{nrel:.2e} (<= 1e-2) relative; memory {100 * mem:.2f}% from the plan (<= 1%) {'OK' if ok else 'FAILED'}")
PY
}
