#!/usr/bin/env python3
# hf_compare.py: train the model cpgen trained, in PyTorch with transformers, and compare step by step.
# Input (written by build/tests/gpu/test_train_tiny with CPGEN_HF_DIR=DIR): DIR/model (Hugging Face checkpoint of
# the initial weights, fp32), DIR/tokens.bin (per step and micro-batch: tokens[T] then targets[T], int32; target -1
# = no loss), DIR/run.json (schedule and AdamW settings, the learning rate of every step), DIR/metrics.jsonl
# (cpgen's loss and gradient norm per step).
# The PyTorch side mirrors cpgen's mixed precision: bf16 weights for forward and backward, fp32 master weights
# updated by torch.optim.AdamW, gradients clipped by the global norm, loss = sum of cross-entropy over the target
# tokens of all micro-batches / their number. Prints a table and exits 1 when they disagree:
#   - the loss curves differ by more than 1% (relative) at any of the first 20 steps;
#   - with DIR/grads (cpgen's gradients of the first sequence, laid out as a checkpoint): against an fp32 reference
#     (transformers in fp32 computing with the weights cpgen computes with, the bf16-rounded masters), the step-1
#     loss differs by more than 1e-3 relative, or any tensor's gradient has a cosine similarity below 0.999 or a
#     norm more than 1e-2 (relative) off. torch's own bf16 gradients are printed beside cpgen's for scale.
import glob
import json
import math
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

CURVE_STEPS = 20  # the loss curves must agree within 1% at each of these steps


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
    worst_loss = worst_norm = worst_nerr = 0.0
    worst_cos, f32_loss = 1.0, None
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
            n0 = int((y0 >= 0).sum())
            lf = F.cross_entropy(f32(input_ids=raw[0, 0, 0].to(dev)[None]).logits[0], y0, ignore_index=-1,
                                 reduction="sum") / n0
            lf.backward()
            if mb == 1:
                f32_loss = abs(ours[0]["loss"] - lf.item()) / abs(lf.item())
            print(f"step 1 gradients per tensor against the fp32 reference (loss {lf.item():.6f}, cpgen "
                  f"{ours[0]['loss']:.6f}): cosine similarity and relative norm error")
            print(f"  {'tensor':<44} {'|g| fp32':>10} {'cos cpgen':>10} {'norm err':>9} {'cos torch':>10} "
                  f"{'norm err':>9}")
            fp = dict(f32.named_parameters())
            sq = [0.0, 0.0, 0.0]
            for name, g in zip(names, grads):
                gr = fp[name].grad.float().flatten()
                gc = gref[name].to(dev).float().flatten()
                gt = g.flatten()
                nr, nc, nt = float(gr.norm()), float(gc.norm()), float(gt.norm())
                sq = [sq[0] + nr * nr, sq[1] + nc * nc, sq[2] + nt * nt]
                cc = float(F.cosine_similarity(gc, gr, dim=0))
                ct = float(F.cosine_similarity(gt, gr, dim=0))
                ec, et = abs(nc - nr) / max(nr, 1e-30), abs(nt - nr) / max(nr, 1e-30)
                worst_cos, worst_nerr = min(worst_cos, cc), max(worst_nerr, ec)
                print(f"  {name:<44} {nr:>10.4e} {cc:>10.6f} {ec:>9.2e} {ct:>10.6f} {et:>9.2e}")
            print(f"  global norm: fp32 {math.sqrt(sq[0]):.5f}, cpgen {math.sqrt(sq[1]):.5f}, torch bf16 "
                  f"{math.sqrt(sq[2]):.5f}")
            del f32
            torch.cuda.empty_cache()
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
        if s < CURVE_STEPS:  # beyond, the two runs may drift apart as any two bf16 runs do
            worst_loss, worst_norm = max(worst_loss, rl), max(worst_norm, rn)
        if first is None:
            first = (rl, rn)
        if s < 10 or (s + 1) % 10 == 0 or s + 1 == steps:
            print(f"{s + 1:>4} {lr:>9.2e} {cl:>11.5f} {loss:>11.5f} {rl:>9.2e} {cn:>11.5f} {norm:>11.5f} {rn:>9.2e}")
    k = min(steps, CURVE_STEPS)
    ok = worst_loss <= 1e-2
    print(f"loss curve: worst relative difference over the first {k} steps {worst_loss:.2e} (bound 1e-2), "
          f"step 1 {first[0]:.2e}; gradient norm worst {worst_norm:.2e}")
    if gref:
        ok_f = f32_loss is None or f32_loss <= 1e-3
        ok_g = worst_cos >= 0.999 and worst_nerr <= 1e-2
        ok = ok and ok_f and ok_g
        fl = "n/a (micro_batches > 1)" if f32_loss is None else f"{f32_loss:.2e}"
        print(f"step 1 against fp32: loss {fl} (bound 1e-3); gradients: worst cosine {worst_cos:.6f} (bound "
              f"0.999), worst norm error {worst_nerr:.2e} (bound 1e-2)")
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
