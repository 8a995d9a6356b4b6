#!/usr/bin/env python3
"""oracle_compare.py: two runs' last weights judged by one forward (hf_val_loss.py's, transformers), beside the
validation losses the runs measured with their own.

Each run's FP8 or bf16 forward measures its own validation loss; when the two differ, that may be the weights (one
run learned more) or the forward (one precision measures lower). hf_val_loss.py evaluates both runs' last
checkpoints on the same held-out sequences in bf16 and fp32: the weights alone then differ.
Reads each run's metrics.jsonl (the last line with "val_loss": its step, loss and "val_tokens") and the JSON lines
hf_val_loss.py printed into its log. Checks, exit 1 when one fails:
  - both runs' last evaluations at the same step;
  - each log holds a bf16 and an fp32 line, each over as many targets as the run's own evaluation counted (the
    sequences and documents were cut as cpgen cuts them);
  - the first run's (bf16's) own validation loss within AGREE (0.1%) of transformers' bf16 forward of its weights: the
    forward the others are judged by computes what cpgen computes.
Prints one line per check, then a line per precision of the forward: each run's loss and the second's distance from
the first, and the second run's own measure beside transformers' bf16 one (what its forward adds).
usage: oracle_compare.py METRICS_A LOG_A METRICS_B LOG_B [NAME_B]"""
import json
import math
import sys

AGREE = 0.001  # measured 2e-6 on the 1B at 32K (docs/PERF.md, 2026-12-04, late evening)


def json_lines(path):
    """the JSON objects among the file's lines (a log's other lines, a torn last line skipped), or None and why"""
    rows = []
    try:
        for line in open(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict):
                rows.append(r)
    except OSError as e:
        return None, f"{path}: {e.strerror}"
    return rows, None


def last_val(path):
    rows, err = json_lines(path)
    if err:
        return None, err
    rows = [r for r in rows if isinstance(r.get("val_loss"), (int, float))]
    return (rows[-1], None) if rows else (None, f"{path}: no validation loss")


def oracle(path):
    rows, err = json_lines(path)
    if err:
        return None, err
    got = {r["dtype"]: r for r in rows if r.get("dtype") in ("bf16", "fp32") and isinstance(r.get("loss"), float)}
    missing = [d for d in ("bf16", "fp32") if d not in got or not math.isfinite(got[d]["loss"])]
    if missing:
        return None, f"{path}: no finite loss of the {' and '.join(missing)} forward"
    return got, None


def main(argv):
    if len(argv) not in (5, 6):
        print(__doc__)
        return 2
    name_b = argv[5] if len(argv) == 6 else "fp8"
    runs, ok = [], True
    for name, metrics, log in (("bf16", argv[1], argv[2]), (name_b, argv[3], argv[4])):
        own, err = last_val(metrics)
        ora, err2 = oracle(log) if not err else (None, None)
        if err or err2:
            print(f"one forward: FAILED: {err or err2}")
            return 1
        for d in ("bf16", "fp32"):
            if ora[d]["targets"] != own.get("val_tokens"):
                print(f"one forward: FAILED: {name}: transformers' {d} forward scored {ora[d]['targets']} targets, "
                      f"the run's evaluation {own.get('val_tokens')}: not the sequences cpgen evaluated")
                ok = False
        runs.append((name, own, ora))
    (na, own_a, ora_a), (nb, own_b, ora_b) = runs
    if own_a["step"] != own_b["step"]:
        print(f"one forward: FAILED: the runs' last evaluations are of steps {own_a['step']} and {own_b['step']}")
        ok = False
    d = abs(ora_a["bf16"]["loss"] / own_a["val_loss"] - 1)
    agree = d <= AGREE
    print(f"one forward: {na}'s own validation loss {own_a['val_loss']:.4f} at step {own_a['step']}, "
          f"transformers' bf16 forward of its weights {ora_a['bf16']['loss']:.4f}, {d:.1e} apart "
          f"(bound {AGREE:.0e}) {'OK' if agree else 'FAILED'}")
    for p in ("bf16", "fp32"):
        a, b = ora_a[p]["loss"], ora_b[p]["loss"]
        print(f"one forward, {p}: {na}'s weights {a:.4f}, {nb}'s {b:.4f}, {nb} {100 * (b / a - 1):+.2f}% against {na}")
    b16 = ora_b["bf16"]["loss"]
    print(f"one forward: {nb}'s own validation loss {own_b['val_loss']:.4f}, transformers' bf16 forward of its weights "
          f"{b16:.4f}: its own forward differs by {own_b['val_loss'] / b16 - 1:+.1e} (relative)")
    return 0 if ok and agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
