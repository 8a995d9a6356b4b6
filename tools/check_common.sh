# check_common.sh: what the GPU check scripts share; sourced after they set $out and $PARTS.
# want PART: is PART among $PARTS. note TEXT: print and add to $out/summary.txt. run NAME TIMEOUT COMMAND...: run
# under a time limit into $out/NAME.log and note its exit status, seconds and, when GREP is set, the first match
# of that pattern in the log.
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
