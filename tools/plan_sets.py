#!/usr/bin/env python3
# plan_sets.py: read `cpgen plan --json` on stdin, print the --set options that make a layer-truncated run keep the
# full plan's choices (stage size, checkpoint spacing up to the run's depth, optimizer place, offload: all of the
# run's checkpoints on the host where the full plan offloads any), one per line.
# usage: cpgen plan SPEC ... --json | tools/plan_sets.py [LAYERS]   (LAYERS: the truncated depth, default 2)
import json
import sys

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
p = json.load(sys.stdin)["parallel"]
for s in (f"model.layers={layers}",
          f"parallel.upipe_heads={p['upipe_heads']}",
          f"parallel.checkpoint_every={min(p['checkpoint_every'], layers)}",
          f"parallel.optimizer={'host' if p['optimizer_on_host'] else 'gpu'}",
          f"parallel.offload={'all' if p['ckpt_host_layers'] else 'none'}"):
    print("--set")
    print(s)
