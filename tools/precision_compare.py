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
Draws both runs' training loss (a 10-step mean) and validation loss into OUT_SVG (matplotlib; without it the checks
still run and the picture is said to be missing). Prints one line per check and a short table last.
The second run may be another (NAME, "fp8" unless given): bf16 with nondeterministic sums, say, whose distance from
the first is the noise floor of the comparison.
usage: precision_compare.py BF16_METRICS FP8_METRICS STEPS OUT_SVG [TITLE [NAME]]"""
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


def main(argv):
    if len(argv) not in (5, 6, 7):
        print(__doc__)
        return 2
    steps, out_svg = int(argv[3]), argv[4]
    title = argv[5] if len(argv) >= 6 else "bf16 and fp8 from the same start"
    two = argv[6] if len(argv) == 7 else "fp8"
    runs = {}
    ok = True
    for name, path in (("bf16", argv[1]), (two, argv[2])):
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
    (tb, vb), (tf, vf) = runs["bf16"], runs[two]
    pairs = []  # (what, bf16, the second run) at the same steps
    for w0 in range(1, steps - WINDOW + 2, WINDOW):
        ws = range(w0, w0 + WINDOW)
        pairs.append((f"training steps {w0}-{w0 + WINDOW - 1}", sum(tb[s] for s in ws) / WINDOW,
                      sum(tf[s] for s in ws) / WINDOW))
    windows = [(p[2] - p[1]) / p[1] for p in pairs]
    last = range(max(1, steps - LAST + 1), steps + 1)
    print(f"training loss: {two} {gap(tb, tf, tb):+.2%} against bf16 over the run, {gap(tb, tf, last):+.2%} over "
          f"the last {len(last)} steps, windows of {WINDOW} from {min(windows):+.2%} to {max(windows):+.2%}")
    common = sorted(set(vb) & set(vf))
    pairs += [(f"validation at step {s}", vb[s], vf[s]) for s in common]
    worse = max(pairs, key=lambda p: (p[2] - p[1]) / p[1])
    better = min(pairs, key=lambda p: (p[2] - p[1]) / p[1])
    up = (worse[2] - worse[1]) / worse[1]
    way_ok = up <= WAY
    print(f"on the way: {two} at most {up:.2%} above bf16 (bound {WAY:.0%}), at {worse[0]}: {worse[1]:.4f} / "
          f"{worse[2]:.4f} {'OK' if way_ok else 'FAILED'}; at most {(better[1] - better[2]) / better[1]:.2%} below, "
          f"at {better[0]}")
    if not common:
        print("at the end: FAILED: no validation loss in both runs")
        end_ok = False
    else:
        s = common[-1]
        d = rel(vf[s], vb[s])
        end_ok = d <= END
        side = " below bf16" if vf[s] < vb[s] else " above bf16" if vf[s] > vb[s] else ""
        print(f"at the end: validation loss at step {s}: bf16 {vb[s]:.4f}, {two} {vf[s]:.4f}, "
              f"difference {d:.2%}{side} (bound {END:.0%}, either side) {'OK' if end_ok else 'FAILED'}")
    print(f"picture: {draw(runs, steps, out_svg, title, two)}")
    print(f"{'step':>6} {'bf16 train':>11} {two[:4] + ' train':>10} {'bf16 val':>9} {two[:4] + ' val':>8}")
    for s in common:
        lo = max(1, s - 9)
        mb = sum(tb[k] for k in range(lo, s + 1)) / (s + 1 - lo)
        mf = sum(tf[k] for k in range(lo, s + 1)) / (s + 1 - lo)
        print(f"{s:6d} {mb:11.4f} {mf:10.4f} {vb[s]:9.4f} {vf[s]:8.4f}")
    return 0 if way_ok and end_ok else 1


def draw(runs, steps, path, title, two):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "not drawn (no matplotlib)"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, color in (("bf16", "#1f77b4"), (two, "#d62728")):
        train, val = runs[name]
        xs = sorted(train)
        mean = [sum(train[k] for k in xs[max(0, i - 9):i + 1]) / (i + 1 - max(0, i - 9)) for i in range(len(xs))]
        ax.plot(xs, mean, color=color, lw=1.2, label=f"{name} training (10-step mean)")
        vs = sorted(val)
        ax.plot(vs, [val[k] for k in vs], color=color, lw=1.2, ls="--", marker="o", ms=3, label=f"{name} validation")
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
