#!/usr/bin/env python3
"""trace_check.py: check a step trace written by `cpgen run SPEC --trace FILE` (runtime/trace.c).

usage: tools/trace_check.py FILE [--step-seconds S] [--tolerance 0.02]

Checks, for every rank (and for the cost model's predicted process where it holds one):
  - the file is JSON with traceEvents and the metadata otherData.cpgen and otherData.ranks;
  - every plan step of the step (each micro-batch's, then the optimizer's, less the steps otherData says did not
    run) appears exactly once as a slice;
  - the slices of one stream do not overlap, and their durations sum to the stream's busy time in the metadata;
  - the measured total (the last slice's end; time 0 is the step's start) is within the tolerance (2%) of the step
    line's time: --step-seconds, else the step_seconds the metadata holds;
  - every wait is a flow pair whose ends lie on existing slices, the waited-for one ending before the waiting one
    starts;
  - the memory counter's peak is the plan's most bytes live at one step (gpu_live_peak).
Prints one line per problem and exits 1, or one summary line and exits 0. Only the standard library is needed.
"""
import argparse
import json
import sys
from collections import defaultdict

EPS_US = 1e-3  # the file's times have four decimals of a microsecond


def check(trace, step_seconds, tolerance):
    problems = []
    bad = problems.append
    events = trace.get("traceEvents")
    other = trace.get("otherData", {})
    common, ranks = other.get("cpgen"), other.get("ranks")
    if not isinstance(events, list) or not isinstance(common, dict) or not isinstance(ranks, list) or not ranks:
        return ["not a cpgen step trace: traceEvents, otherData.cpgen or otherData.ranks is missing"], ""
    slices = defaultdict(list)  # pid -> X events
    at = {}  # (pid, tid, ts) -> the slice starting there
    flows = defaultdict(dict)  # id -> {"s": event, "f": event}
    counters = defaultdict(list)  # pid -> counter values
    for ev in events:
        ph = ev.get("ph")
        if ph == "X":
            slices[ev["pid"]].append(ev)
            at[(ev["pid"], ev["tid"], ev["ts"])] = ev
        elif ph in ("s", "f"):
            if ph in flows[ev["id"]]:
                bad(f"flow {ev['id']}: two '{ph}' events")
            flows[ev["id"]][ph] = ev
        elif ph == "C":
            counters[ev["pid"]].append(ev["args"]["bytes"])

    def steps_once(pid, meta, not_run, who):
        want = {(i, mb) for mb in range(meta["micro_batches"]) for i in range(meta["micro_steps"])}
        want |= {(i, 0) for i in range(meta["micro_steps"], meta["plan_steps"])}
        want -= not_run
        seen = defaultdict(int)
        for ev in slices[pid]:
            seen[(ev["args"]["step"], ev["args"]["micro_batch"])] += 1
        for key in sorted(want):
            if seen[key] == 0:
                bad(f"{who}: plan step {key[0]} of micro-batch {key[1]} is missing")
            elif seen[key] > 1:
                bad(f"{who}: plan step {key[0]} of micro-batch {key[1]} appears {seen[key]} times")
        for key in sorted(set(seen) - want):
            bad(f"{who}: a slice of plan step {key[0]}, micro-batch {key[1]}, which the step does not run")

    def streams(pid, busy, who):
        by_tid = defaultdict(list)
        for ev in slices[pid]:
            by_tid[ev["tid"]].append(ev)
        for tid, evs in sorted(by_tid.items()):
            evs.sort(key=lambda e: e["ts"])
            total = sum(e["dur"] for e in evs)
            want = busy[tid] * 1e6
            if abs(total - want) > 1e-4 * len(evs) + 1e-6 * want:
                bad(f"{who}, stream {tid}: slices sum to {total:.3f} us, the stream was busy {want:.3f} us")
            for a, b in zip(evs, evs[1:]):
                if b["ts"] < a["ts"] + a["dur"] - EPS_US:
                    bad(f"{who}, stream {tid}: '{b['name']}' at {b['ts']} us starts before '{a['name']}' ends")
                    break
        return max((e["ts"] + e["dur"] for e in slices[pid]), default=0.0)

    def memory(pid, peak, who):
        if not counters[pid]:
            bad(f"{who}: no memory counter")
        elif max(counters[pid]) != peak:
            bad(f"{who}: the memory counter peaks at {max(counters[pid])} bytes, the plan at {peak}")

    for meta in ranks:
        pid, who = meta["pid"], f"rank {meta['rank']}"
        not_run = {tuple(x) for x in meta["not_run"]}
        steps_once(pid, meta, not_run, who)
        end_us = streams(pid, meta["busy_seconds"], who)
        want = step_seconds if step_seconds else meta["step_seconds"]
        if abs(end_us / 1e6 - want) > tolerance * want:
            bad(f"{who}: the slices end at {end_us / 1e6:.6f} s, the step took {want:.6f} s: more than "
                f"{100 * tolerance:g}% apart")
        memory(pid, meta["gpu_live_peak"], who)
    predicted = common.get("predicted_pid")
    if predicted is not None:
        meta = ranks[0]
        steps_once(predicted, meta, set(), "predicted")
        streams(predicted, meta["predicted_busy_seconds"], "predicted")
        memory(predicted, meta["gpu_live_peak"], "predicted")

    for fid, pair in sorted(flows.items()):
        if set(pair) != {"s", "f"}:
            bad(f"flow {fid}: has {'/'.join(sorted(pair))} only, not both ends")
            continue
        s, f = pair["s"], pair["f"]
        ok = True
        for end in (s, f):
            if (end["pid"], end["tid"], end["ts"]) not in at:
                bad(f"flow {fid}: no slice of process {end['pid']}, stream {end['tid']} starts at {end['ts']} us")
                ok = False
        if not ok:
            continue
        src = at[(s["pid"], s["tid"], s["ts"])]
        if f["ts"] < src["ts"] + src["dur"] - EPS_US:
            bad(f"flow {fid}: the waiting step starts at {f['ts']} us, before '{src['name']}' ends")

    nslices = sum(len(v) for v in slices.values())
    summary = (f"{len(ranks)} rank(s), {nslices} slices, {len(flows)} waits; step "
               f"{ranks[0]['measured_seconds']:.6f} s measured, {ranks[0]['predicted_seconds']:.6f} s predicted")
    return problems, summary


def main():
    ap = argparse.ArgumentParser(description="check a cpgen step trace")
    ap.add_argument("file")
    ap.add_argument("--step-seconds", type=float, default=0.0,
                    help="the step line's time; default: the one the trace's metadata holds")
    ap.add_argument("--tolerance", type=float, default=0.02)
    a = ap.parse_args()
    try:
        with open(a.file) as fh:
            trace = json.load(fh)
    except (OSError, ValueError) as e:
        print(f"trace_check: {a.file}: cannot read it as JSON: {e}")
        return 1
    try:
        problems, summary = check(trace, a.step_seconds, a.tolerance)
    except (KeyError, TypeError, AttributeError) as e:
        problems, summary = [f"an event or the metadata lacks a field or has the wrong type: {e!r}"], ""
    for p in problems[:50]:
        print(f"trace_check: {a.file}: {p}")
    if len(problems) > 50:
        print(f"trace_check: {a.file}: ... and {len(problems) - 50} more problems")
    if problems:
        return 1
    print(f"trace_check: {a.file}: ok: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
