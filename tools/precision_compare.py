#!/usr/bin/env python3
"""precision_compare.py: two runs of one spec from the same start, bf16 and train.precision = "fp8", judged and drawn.

Reads each run's metrics.jsonl (a line per step; validation lines carry "val_loss"). Checks, exit 1 when one fails:
  - each run logged STEPS training steps, every loss finite;
  - no divergence on the way: the mean training loss of every window of 20 steps, and every validation loss, of the
    fp8 run at most WAY (3%) above the bf16 run's at the same steps (divergence is fp8 doing worse; where it does
    better, by as much as 3.4% over 20 steps of a real-text run, that is the noise of two runs, and it is printed);
  - at the end: the last validation loss of the fp8 run within END (1%) of the bf16 run's, above or below.
Prints, unjudged, how far the second run's training loss lies from bf16's: its mean over the run and over the last
LAST (100) steps, and the range of the windows' gaps.
With --band LABEL=METRICS ..., more bf16 runs from the same start that differ by what the comparison should not
turn on (the learning rate 10% either way: gpu-real-text-run.sh's LR_BAND) join the first as bf16's band, and the
second run is judged against the band: on the way at most WAY above the band's highest at each window and
evaluation; at the end within END of the band, from END below its lowest to END above its highest. A run's end
moves by more than 1% with such a change (docs/PERF.md, 2026-12-04, at night), so one bf16 run is a point of a
spread; the distance from the first run alone is printed, unjudged, and so is the band's own spread.
Draws the runs' training loss (a 10-step mean) and validation loss into OUT_SVG, the band's in grey (matplotlib;
without it the checks still run and the picture is said to be missing). Prints one line per check and a short table
last. The second run may be another (NAME, "fp8" unless given): bf16 with nondeterministic sums, say, whose distance
from the first is the noise floor of the comparison.
usage: precision_compare.py BF16_METRICS FP8_METRICS STEPS OUT_SVG [TITLE [NAME]] [--band LABEL=METRICS ...]"""
import json
import math
import sys

WAY, END, WINDOW, LAST = 0.03, 0.01, 20, 100


def load(path):
    train, val = {}, {}
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        return None, None, f"{path}: {e.strerror}"
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line
        step = row.get("step")
        if not isinstance(step, int):
            continue
        if "loss" in row:
            train[step] = row["loss"]
        if isinstance(row.get("val_loss"), (int, float)):
            val[step] = row["val_loss"]
    return train, val, None


def gap(base, other, steps):
    """other's mean over steps against base's, relative"""
    return sum(other[s] for s in steps) / sum(base[s] for s in steps) - 1


def rel(a, b):
    return abs(a - b) / abs(b) if b else math.inf


def side(v, ref):
    return " below" if v < ref else " above" if v > ref else ""


def main(argv):
    args, band = argv[1:], []
    if "--band" in args:
        i = args.index("--band")
        args, band = args[:i], args[i + 1:]
    if len(args) not in (4, 5, 6) or not all("=" in b for b in band) or (band == [] and "--band" in argv):
        print(__doc__)
        return 2
    steps, out_svg = int(args[2]), args[3]
    title = args[4] if len(args) >= 5 else "bf16 and fp8 from the same start"
    two = args[5] if len(args) == 6 else "fp8"
    sources = [("bf16", args[0]), (two, args[1])] + [tuple(b.split("=", 1)) for b in band]
    if len({name for name, _ in sources}) != len(sources):
        print(f"precision compare: the runs need names of their own: {', '.join(n for n, _ in sources)}")
        return 2
    refs = ["bf16"] + [label for label, _ in sources[2:]]  # bf16's band: the first run and its neighbours
    runs = {}
    ok = True
    for name, path in sources:
        train, val, err = load(path)
        if err:
            print(f"precision compare: FAILED: {err}")
            return 1
        bad = [s for s, v in train.items() if not isinstance(v, (int, float)) or not math.isfinite(v)]
        if len(train) != steps or bad:
            print(f"{name}: FAILED: {len(train)} training steps of {steps}, {len(bad)} losses not finite")
            ok = False
        runs[name] = (train, val)
    if not ok:
        return 1
    tb, tf = runs["bf16"][0], runs[two][0]
    ref_name = "bf16" if len(refs) == 1 else "bf16's band"
    pairs, windows = [], []  # pairs: (what, the reference's highest, the second run, its lowest) at the same steps
    for w0 in range(1, steps - WINDOW + 2, WINDOW):
        mean = {n: sum(runs[n][0][s] for s in range(w0, w0 + WINDOW)) / WINDOW for n in runs}
        windows.append(mean[two] / mean["bf16"] - 1)
        pairs.append((f"training steps {w0}-{w0 + WINDOW - 1}", max(mean[r] for r in refs), mean[two],
                      min(mean[r] for r in refs)))
    last = range(max(1, steps - LAST + 1), steps + 1)
    print(f"training loss: {two} {gap(tb, tf, tb):+.2%} against bf16 over the run, {gap(tb, tf, last):+.2%} over "
          f"the last {len(last)} steps, windows of {WINDOW} from {min(windows):+.2%} to {max(windows):+.2%}")
    common = sorted(set.intersection(*(set(runs[r][1]) for r in runs)))
    pairs += [(f"validation at step {s}", max(runs[r][1][s] for r in refs), runs[two][1][s],
               min(runs[r][1][s] for r in refs)) for s in common]
    worse = max(pairs, key=lambda p: (p[2] - p[1]) / p[1])
    better = min(pairs, key=lambda p: (p[2] - p[3]) / p[3])
    up = (worse[2] - worse[1]) / worse[1]
    way_ok = up <= WAY
    down = (better[3] - better[2]) / better[3]
    print(f"on the way: {two} " + (f"at most {up:.2%} above" if up >= 0 else f"never above (closest {-up:.2%} below)") +
          f" {ref_name} (bound {WAY:.0%}), at {worse[0]}: {worse[1]:.4f} / {worse[2]:.4f} {'OK' if way_ok else 'FAILED'}"
          "; " + (f"at most {down:.2%} below" if down >= 0 else f"never below (closest {-down:.2%} above)") +
          f", at {better[0]}")
    if not common:
        print("at the end: FAILED: no validation loss in every run")
        end_ok = False
    else:
        s = common[-1]
        v, vb = runs[two][1][s], runs["bf16"][1][s]
        ends = sorted((runs[r][1][s], r) for r in refs)  # one bf16 run, or its band
        (lo, lo_name), (hi, hi_name) = ends[0], ends[-1]
        d = rel(v, lo) if v < lo else rel(v, hi) if v > hi else 0.0
        end_ok = d <= END
        verdict = "OK" if end_ok else "FAILED"
        if len(refs) == 1:
            print(f"at the end: validation loss at step {s}: bf16 {vb:.4f}, {two} {v:.4f}, "
                  f"difference {d:.2%}{side(v, vb)} bf16 (bound {END:.0%}, either side) {verdict}")
        else:
            where = (f"{d:.2%} below its lowest" if v < lo else f"{d:.2%} above its highest" if v > hi
                     else "inside it")
            print(f"bf16's band at step {s}: " + ", ".join(f"{r} {e:.4f}" for e, r in ends) +
                  f"; its spread {rel(hi, lo):.2%}")
            print(f"at the end: validation loss at step {s}: bf16's band {lo:.4f} ({lo_name}) to {hi:.4f} "
                  f"({hi_name}), {two} {v:.4f}, {where} (bound {END:.0%} outside it, either side) {verdict}")
            print(f"against bf16 alone (unjudged): {two} {rel(v, vb):.2%}{side(v, vb)} bf16's {vb:.4f}")
    print(f"picture: {draw(runs, refs, steps, out_svg, title, two)}")
    print(f"{'step':>6} {'bf16 train':>11} {two[:4] + ' train':>10} {'bf16 val':>9} {two[:4] + ' val':>8}" +
          "".join(f" {r[:8] + ' val':>12}" for r in refs[1:]))
    for s in common:
        w = range(max(1, s - 9), s + 1)  # the 10 steps to s
        mb, mf = sum(tb[k] for k in w) / len(w), sum(tf[k] for k in w) / len(w)
        print(f"{s:6d} {mb:11.4f} {mf:10.4f} {runs['bf16'][1][s]:9.4f} {runs[two][1][s]:8.4f}" +
              "".join(f" {runs[r][1][s]:12.4f}" for r in refs[1:]))
    return 0 if way_ok and end_ok else 1


def draw(runs, refs, steps, path, title, two):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "not drawn (no matplotlib)"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = [("bf16", "#1f77b4", 1.2), (two, "#d62728", 1.2)] + [(r, "#888888", 0.8) for r in refs[1:]]
    for name, color, lw in styles:
        train, val = runs[name]
        xs = sorted(train)
        mean = [sum(train[k] for k in xs[max(0, i - 9):i + 1]) / (i + 1 - max(0, i - 9)) for i in range(len(xs))]
        ax.plot(xs, mean, color=color, lw=lw, label=f"{name} training (10-step mean)")
        vs = sorted(val)
        ax.plot(vs, [val[k] for k in vs], color=color, lw=lw, ls="--", marker="o", ms=3, label=f"{name} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_xlim(0, steps)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="svg")
    except OSError as e:
        return f"not drawn ({path}: {e.strerror})"
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv))
