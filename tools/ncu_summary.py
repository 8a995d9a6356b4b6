#!/usr/bin/env python3
"""ncu_summary.py: the table tools/gpu-attention-profile.sh prints last, from Nsight Compute's raw page (`ncu --import
REP --csv --page raw`) of one profiled launch per direction of attention: duration, TF/s from it (forward
4 S^2 QH D / 2, causal; backward 2.5 times that), SM throughput, tensor pipe use, registers per thread, achieved
occupancy, shared memory per block and the top three warp stall reasons.
Metric names move between Nsight Compute versions and architectures (the Hopper wgmma pipe has names of its own), so
each column tries several candidates in turn and prints n/a when none is there; the names taken are listed under the
table, so that a reader knows what a figure is.
usage: ncu_summary.py --seq S --q-heads QH --head-dim D [--kv-heads KVH] DIR=RAW_CSV...   (DIR: fwd or bwd)
Exit 0, or 1 when a file is missing or holds no profiled launch with a duration. Standard library only."""
import argparse
import csv
import re
import sys

DURATION = ["gpu__time_duration.sum", "gpu__time_duration.avg", "gpu__time_duration.max"]
SM_THROUGHPUT = ["sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "sm__throughput.avg.pct_of_peak_sustained_active"]
# the wgmma pipe first (Hopper's warpgroup MMAs), then the pipe of mma.sync, then names of any tensor pipe
TENSOR = ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
          "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
          "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active"]
REGISTERS = ["launch__registers_per_thread"]
OCCUPANCY = ["sm__warps_active.avg.pct_of_peak_sustained_active"]
SMEM_PARTS = ["launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic"]
SMEM_TOTAL = ["launch__shared_mem_per_block"]
# warp stall families, the first present wins: (pattern whose group 1 is the reason, what its figures are)
STALLS = [
    (r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio", "warp cycles per issued instruction"),
    (r"smsp__average_warp_latency_issue_stalled_(\w+?)\.ratio", "warp cycles per issued instruction"),
    (r"smsp__average_warp_latency_issue_stalled_(\w+?)\.pct", "% of the warp cycles"),
    (r"smsp__warp_issue_stalled_(\w+?)_per_warp_active\.pct", "% of the active warp cycles"),
    (r"smsp__pcsamp_warps_issue_stalled_(\w+?)(?:\.sum)?", "PC samples"),
]
# 'selected' is a warp issuing, not stalled; the pcsamp '_not_issued' variants count the same stalls again
NOT_STALLS = {"selected"}

TIME_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3,
           "s": 1e3}
BYTES = {"byte": 1, "B": 1, "Kbyte": 1e3, "KB": 1e3, "Kibyte": 1024, "KiB": 1024, "Mbyte": 1e6, "MB": 1e6,
         "Mibyte": 1 << 20, "MiB": 1 << 20}


def number(text):
    """A metric's value as a float (thousands separators dropped), or None for n/a and the like."""
    try:
        return float(text.replace(",", "").strip())
    except (AttributeError, ValueError):
        return None


def read_raw(path):
    """The first profiled launch in a raw-page CSV: (kernel name, {metric: (unit, value)}). Lines before the header
    (==PROF== and the like) are skipped; both the wide layout (a column per metric, a row of units under the header)
    and the long one (Metric Name / Metric Unit / Metric Value rows) are read."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"') or l.startswith("ID,")), None)
    if start is None:
        return None, {}
    rows = list(csv.reader(lines[start:]))
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    kernel, metrics = None, {}
    if "Metric Name" in col:
        first = None
        for r in rows[1:]:
            if len(r) < len(head):
                continue
            first = r[col["ID"]] if first is None else first
            if r[col["ID"]] != first:
                break
            kernel = r[col.get("Kernel Name", 0)]
            metrics[r[col["Metric Name"]]] = (r[col["Metric Unit"]], r[col["Metric Value"]])
        return kernel, metrics
    units = rows[1] if len(rows) > 1 and rows[1] and rows[1][0] == "" else [""] * len(head)
    data = [r for r in rows[1:] if r and r[0] != "" and len(r) >= len(head)]
    if not data:
        return None, {}
    r = data[0]
    kernel = r[col["Kernel Name"]] if "Kernel Name" in col else None
    for i, name in enumerate(head):
        metrics[name] = (units[i] if i < len(units) else "", r[i])
    return kernel, metrics


def first(metrics, names):
    """(name, unit, value) of the first of names present with a number, or None."""
    for n in names:
        if n in metrics and number(metrics[n][1]) is not None:
            return n, metrics[n][0], number(metrics[n][1])
    return None


def stalls(metrics):
    """The top three stall reasons of the first stall family present: ([(reason, value)], what the values are)."""
    for pattern, what in STALLS:
        found = {}
        for name, (_, text) in metrics.items():
            m = re.fullmatch(pattern, name)
            v = number(text)
            if not m or v is None or m.group(1) in NOT_STALLS or m.group(1).endswith("_not_issued"):
                continue
            found[m.group(1)] = v
        if found:
            top = sorted(found.items(), key=lambda kv: -kv[1])[:3]
            return top, what
    return [], None


def summarize(metrics, flops):
    """A table row's cells and the metric names they came from."""
    used, cells = {}, {}
    d = first(metrics, DURATION)
    ms = d[2] * TIME_MS.get(d[1], 1e-6) if d else None  # base units (nsecond) when the unit is missing
    cells["ms"] = f"{ms:.3f}" if ms else "n/a"
    cells["tfs"] = f"{flops / (ms * 1e-3) / 1e12:.1f}" if ms else "n/a"
    for key, names, fmt in (("sm", SM_THROUGHPUT, "{:.1f}"), ("tensor", TENSOR, "{:.1f}"),
                            ("regs", REGISTERS, "{:.0f}"), ("occ", OCCUPANCY, "{:.1f}")):
        hit = first(metrics, names)
        cells[key] = fmt.format(hit[2]) if hit else "n/a"
        if hit:
            used[key] = hit[0]
    parts = [first(metrics, [n]) for n in SMEM_PARTS]
    parts = [p for p in parts if p] or [p for p in [first(metrics, SMEM_TOTAL)] if p]
    cells["smem"] = f"{sum(v * BYTES.get(u, 1) for _, u, v in parts) / 1024:.1f}" if parts else "n/a"
    top, what = stalls(metrics)
    cells["stalls"] = ", ".join(f"{r} {v:.0f}" if v >= 100 else f"{r} {v:.3g}" for r, v in top) if top else "n/a"
    if what:
        used["stalls"] = what
    return ms, cells, used


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--q-heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, default=0, help="only for the title")
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("files", nargs="+", metavar="DIR=RAW_CSV")
    a = ap.parse_args(argv)
    fwd_flops = 4.0 * a.seq * a.seq * a.q_heads * a.head_dim / 2
    heads = f"{a.q_heads}/{a.kv_heads}" if a.kv_heads else f"{a.q_heads} query"
    print(f"causal attention, S={a.seq}, D={a.head_dim}, heads {heads}, one launch each (ncu --clock-control none)")
    print("TF/s = fwd 4*S^2*H*D/2, bwd 2.5x fwd; smem: KiB per block; stalls: their three largest")
    print(f"{'dir':<4} {'ms':>9} {'TF/s':>7} {'SM %':>6} {'tensor %':>8} {'regs':>5} {'occ %':>6} {'smem':>6}  "
          f"top warp stalls")
    failed, notes = [], []
    for spec in a.files:
        d, _, path = spec.partition("=")
        flops = fwd_flops * (2.5 if d == "bwd" else 1.0)
        try:
            kernel, metrics = read_raw(path)
        except OSError as e:
            kernel, metrics = None, {}
            failed.append(f"{d}: {path}: {e.strerror}")
        ms, c, used = summarize(metrics, flops)
        if ms is None and not any(f.startswith(f"{d}:") for f in failed):
            failed.append(f"{d}: {path}: no profiled launch with a duration")
        print(f"{d:<4} {c['ms']:>9} {c['tfs']:>7} {c['sm']:>6} {c['tensor']:>8} {c['regs']:>5} {c['occ']:>6} "
              f"{c['smem']:>6}  {c['stalls']}")
        if kernel:
            notes.append(f"{d}: {kernel}")
        if "tensor" in used:
            notes.append(f"{d}: tensor % is {used['tensor']}")
        if "stalls" in used:
            notes.append(f"{d}: stalls in {used['stalls']}")
    for n in notes:
        print(f"  {n}")
    for f in failed:
        print(f"FAILED: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
