#!/usr/bin/env python3
# hf_compare.py: train the model cpgen trained, in PyTorch with transformers, and compare step by step.
# Input (written by build/tests/gpu/test_train_tiny with CPGEN_HF_DIR=DIR): DIR/model (Hugging Face checkpoint of
# the initial weights, fp32), DIR/tokens.bin (per step and micro-batch: tokens[T] then targets[T], int32; target -1
# = no loss), DIR/run.json (schedule and AdamW settings, the learning rate of every step), DIR/metrics.jsonl
# (cpgen's loss and gradient norm per step).
# The PyTorch side mirrors cpgen's mixed precision: bf16 weights for forward and backward, fp32 master weights
# updated by torch.optim.AdamW, gradients clipped by the global norm, loss = sum of cross-entropy over the target
# tokens of all micro-batches / their number. Prints a table and exits 1 when the curves disagree.
# With DIR/grads (cpgen's gradients of the first step, same layout as a checkpoint), it also compares the gradient
# of every tensor at step 1 with torch's bf16 gradient and with an fp32 reference (the bf16-rounded weights in fp32).
import glob
import json
import math
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "hf"
    run = json.load(open(f"{d}/run.json"))
    ours = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
    steps, mb, T = run["steps"], run["micro_batches"], run["seq_len"]
    raw = torch.frombuffer(bytearray(open(f"{d}/tokens.bin", "rb").read()), dtype=torch.int32)
    raw = raw.view(steps, mb, 2, T).long()
    dev = "cuda"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(f"{d}/model", torch_dtype=torch.float32,
                                                 attn_implementation="eager").to(dev)
    names = [n for n, _ in model.named_parameters()]
    master = [p.detach().clone().float().requires_grad_(True) for p in model.parameters()]
    gref = {}
    for f in sorted(glob.glob(f"{d}/grads/*.safetensors")):
        from safetensors.torch import load_file
        gref.update(load_file(f))
    f32 = None
    if gref:
        # fp32 reference: the same bf16 weights, computed in fp32
        f32 = AutoModelForCausalLM.from_pretrained(f"{d}/model", torch_dtype=torch.float32,
                                                   attn_implementation="eager").to(dev)
        with torch.no_grad():
            for p in f32.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    model = model.to(torch.bfloat16)
    params = list(model.parameters())
    opt = torch.optim.AdamW(master, lr=run["lr"], betas=(run["beta1"], run["beta2"]), eps=run["eps"],
                            weight_decay=run["weight_decay"])
    print(f"{len(names)} tensors, {sum(p.numel() for p in params):,} parameters; {steps} steps of {mb} x {T} tokens")
    print(f"{'step':>4} {'lr':>9} {'loss cpgen':>11} {'loss torch':>11} {'rel':>9} {'norm cpgen':>11} "
          f"{'norm torch':>11} {'rel':>9}")
    worst_loss = worst_norm = 0.0
    first = None
    for s in range(steps):
        lr = run["lrs"][s]
        for g in opt.param_groups:
            g["lr"] = lr
        model.zero_grad(set_to_none=True)
        tg = raw[s, :, 1]
        n = int((tg >= 0).sum())
        total = 0.0
        for b in range(mb):
            x = raw[s, b, 0].to(dev)[None]
            y = raw[s, b, 1].to(dev)
            logits = model(input_ids=x).logits[0].float()
            ls = F.cross_entropy(logits, y, ignore_index=-1, reduction="sum")
            (ls / n).backward()
            total += ls.item()
        loss = total / n
        grads = [p.grad.float() for p in params]
        if s == 0 and f32 is not None:
            y0 = raw[0, 0, 1].to(dev)
            lf = F.cross_entropy(f32(input_ids=raw[0, 0, 0].to(dev)[None]).logits[0], y0, ignore_index=-1,
                                 reduction="sum")
            (lf / n).backward()
            print(f"step 1 gradients per tensor (fp32 loss {lf.item() / n:.6f}); relative to the fp32 reference:")
            print(f"  {'tensor':<44} {'|g| fp32':>10} {'|g| cpgen':>10} {'|g| torch':>10} {'cpgen err':>10} "
                  f"{'torch err':>10} {'cpgen-torch':>11}")
            fp = dict(f32.named_parameters())
            sq = [0.0, 0.0, 0.0]
            for name, g in zip(names, grads):
                gr = fp[name].grad.float()
                gc = gref[name].to(dev).float()
                nr = float(gr.norm())
                sq = [sq[0] + nr * nr, sq[1] + float(gc.norm()) ** 2, sq[2] + float(g.norm()) ** 2]
                ec = float((gc - gr).norm()) / max(nr, 1e-30)
                et = float((g - gr).norm()) / max(nr, 1e-30)
                ect = float((gc - g).norm()) / max(float(g.norm()), 1e-30)
                print(f"  {name:<44} {nr:>10.4e} {float(gc.norm()):>10.4e} {float(g.norm()):>10.4e} {ec:>10.2e} "
                      f"{et:>10.2e} {ect:>11.2e}")
            print(f"  global norm: fp32 {math.sqrt(sq[0]):.5f}, cpgen {math.sqrt(sq[1]):.5f}, torch bf16 "
                  f"{math.sqrt(sq[2]):.5f}")
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        clip = min(1.0, run["clip"] / (norm + 1e-6)) if run["clip"] > 0 else 1.0
        for m, g in zip(master, grads):
            m.grad = g * clip
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m.to(torch.bfloat16))
        cl, cn = ours[s]["loss"], ours[s]["norm"]
        rl, rn = abs(cl - loss) / abs(loss), abs(cn - norm) / max(norm, 1e-12)
        if s < 30:  # beyond, the two runs may drift apart as any two bf16 runs do
            worst_loss, worst_norm = max(worst_loss, rl), max(worst_norm, rn)
        if first is None:
            first = (rl, rn)
        if s < 10 or (s + 1) % 10 == 0 or s + 1 == steps:
            print(f"{s + 1:>4} {lr:>9.2e} {cl:>11.5f} {loss:>11.5f} {rl:>9.2e} {cn:>11.5f} {norm:>11.5f} {rn:>9.2e}")
    ok = first[0] < 2e-3 and first[1] < 2e-2 and worst_loss < 2e-2
    print(f"step 1: loss rel diff {first[0]:.2e} (bound 2e-3), gradient norm rel diff {first[1]:.2e} (bound 2e-2); "
          f"over the first {min(steps, 30)} steps: worst loss rel diff {worst_loss:.2e} (bound 2e-2), worst norm rel diff "
          f"{worst_norm:.2e}: {'MATCH' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
