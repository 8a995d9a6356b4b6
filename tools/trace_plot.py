#!/usr/bin/env python3
"""trace_plot.py: one layer of a step trace (`cpgen run --trace FILE`) as a picture: the measured streams of one
rank above the cost model's predicted streams, each over the time its layer's forward (or backward) takes, every
plan step a bar coloured by its kind of work and labelled where it is wide enough.

usage: tools/trace_plot.py TRACE OUT.png [--layer 0] [--phase fwd|bwd] [--rank 0] [--dry]

--dry prints the windows and the slices counted instead of drawing (no matplotlib needed).
"""
import argparse
import json
import sys

KIND_COLORS = {"gemm": "#4878d0", "kernel": "#ee854a", "all_to_all": "#6acc64", "all_gather": "#d65f5f",
               "reduce_scatter": "#956cb4", "all_reduce": "#8c613c", "copy_d2h": "#dc7ec0", "copy_h2d": "#797979",
               "memset": "#d5bb67"}


def window(trace, pid, layer, phases):
    """The slices of process pid that overlap the layer's first run of the given phases on the compute stream (a
    layer's steps come again later: its recompute, a segment's forward again)."""
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == pid]
    compute = sorted((e for e in slices if e["tid"] == 0), key=lambda e: e["ts"])
    first = next((k for k, e in enumerate(compute) if e["args"]["layer"] == layer and e["args"]["phase"] in phases),
                 None)
    if first is None:
        return None, None, []
    last = first
    while last + 1 < len(compute) and compute[last + 1]["args"]["layer"] == layer:
        last += 1
    t0, t1 = compute[first]["ts"], compute[last]["ts"] + compute[last]["dur"]
    return t0, t1, [e for e in slices if e["ts"] < t1 and e["ts"] + e["dur"] > t0]


def main():
    ap = argparse.ArgumentParser(description="draw one layer of a cpgen step trace")
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--phase", choices=["fwd", "bwd"], default="fwd")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    with open(a.trace) as fh:
        trace = json.load(fh)
    other = trace["otherData"]
    ranks = {r["rank"]: r for r in other["ranks"]}
    if a.rank not in ranks:
        print(f"trace_plot: {a.trace} has ranks {sorted(ranks)}, not {a.rank}")
        return 2
    phases = ("fwd",) if a.phase == "fwd" else ("recompute", "bwd")
    panels = [(f"rank {a.rank}, measured", ranks[a.rank]["pid"]), ("predicted (cost model)", other["cpgen"]["predicted_pid"])]
    cuts = [(name, *window(trace, pid, a.layer, phases)) for name, pid in panels]
    for name, t0, t1, sl in cuts:
        if t0 is None:
            print(f"trace_plot: {a.trace}: no {a.phase} slices of layer {a.layer} in '{name}'")
            return 2
        print(f"{name}: layer {a.layer} {a.phase} from {t0 / 1e3:.3f} ms to {t1 / 1e3:.3f} ms, {len(sl)} slices")
    if a.dry:
        return 0
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    streams = other["cpgen"]["streams"]
    fig, axes = plt.subplots(2, 1, figsize=(16, 6.5), constrained_layout=True)
    for ax, (name, t0, t1, sl) in zip(axes, cuts):
        span = t1 - t0
        for e in sl:
            x = (e["ts"] - t0) / 1e3
            w = e["dur"] / 1e3
            y = len(streams) - 1 - e["tid"]
            ax.barh(y, w, left=x, height=0.8, color=KIND_COLORS.get(e["cat"], "#cccccc"), edgecolor="white",
                    linewidth=0.3)
            if e["dur"] > 0.04 * span:
                ax.text(x + w / 2, y, e["args"]["what"], ha="center", va="center", fontsize=7, clip_on=True)
        ax.set_yticks(range(len(streams)))
        ax.set_yticklabels(list(reversed(streams)))
        ax.set_xlim(0, span / 1e3)
        ax.set_xlabel("ms from the start of the layer")
        ax.set_title(f"{name}: layer {a.layer} {a.phase}, {span / 1e3:.2f} ms")
    kinds = sorted({e["cat"] for _, _, _, sl in cuts for e in sl})
    axes[0].legend(handles=[Patch(color=KIND_COLORS.get(k, "#cccccc"), label=k) for k in kinds], loc="upper right",
                   fontsize=8, ncol=len(kinds))
    spec = other["cpgen"]["spec"]
    fig.suptitle(f"{spec}: {other['cpgen']['seq_len']} tokens on {other['cpgen']['gpus']} GPU(s), step "
                 f"{other['cpgen']['step']} ({ranks[a.rank]['measured_seconds']:.3f} s measured, "
                 f"{ranks[a.rank]['predicted_seconds']:.3f} s predicted)")
    fig.savefig(a.out, dpi=150)
    print(f"trace_plot: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
