#!/usr/bin/env python3
# hf_compare.py: train the model cpgen trained, in PyTorch with transformers, and compare step by step.
# Input (written by build/tests/gpu/test_train_tiny with CPGEN_HF_DIR=DIR): DIR/model (Hugging Face checkpoint of
# the initial weights, fp32), DIR/tokens.bin (per step and micro-batch: tokens[T] then targets[T], int32; target -1
# = no loss), DIR/run.json (schedule and AdamW settings, the learning rate of every step), DIR/metrics.jsonl
# (cpgen's loss and gradient norm per step).
# PyTorch trains the same steps twice with torch.optim.AdamW and the same schedule, gradients clipped by the global
# norm, loss = sum of cross-entropy over the target tokens of all micro-batches / their number: in fp32 (the
# reference) and in cpgen's mixed precision (bf16 weights for forward and backward, fp32 masters), printed for
# scale. Prints a table and exits 1 when they disagree:
#   - cpgen's loss differs from the fp32 run's by more than 1% (relative) at any of the first 20 steps;
#   - with DIR/grads (cpgen's gradients of step 1, all its micro-batches, laid out as a checkpoint): against an
#     fp32 reference (transformers in fp32 computing with the weights cpgen computes with, the bf16-rounded
#     masters), the step-1 loss differs by more than 1e-3 relative, or any tensor's gradient has a cosine
#     similarity below 0.999 or a norm more than 1e-2 (relative) off. torch's own bf16 gradients are printed beside cpgen's for scale.
import glob
import json
import math
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

CURVE_STEPS = 20  # the loss curves must agree within 1% at each of these steps


def load(d, dev):
    return AutoModelForCausalLM.from_pretrained(f"{d}/model", torch_dtype=torch.float32,
                                                attn_implementation="eager").to(dev)


def forward_backward(model, raw, s, n, dev):
    """Loss of step s over its micro-batches (sum of token losses / n); gradients accumulate in model."""
    total = 0.0
    for b in range(raw.shape[1]):
        logits = model(input_ids=raw[s, b, 0].to(dev)[None]).logits[0].float()
        ls = F.cross_entropy(logits, raw[s, b, 1].to(dev), ignore_index=-1, reduction="sum")
        (ls / n).backward()
        total += ls.item()
    return total / n


def clip_grads(grads, clip):
    norm = math.sqrt(sum(float((g.float() * g.float()).sum()) for g in grads))
    return norm, (min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0)


def check_gradients(ref, names, gref, raw, cpgen_loss, dev):
    """Step 1 against fp32: ref computes with the bf16-rounded weights cpgen computes with, over step 1's micro-batches.
    Returns (loss relative difference, worst cosine, worst norm error)."""
    saved = [p.detach().clone() for p in ref.parameters()]
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    lf = forward_backward(ref, raw, 0, int((raw[0, :, 1] >= 0).sum()), dev)
    rel = abs(cpgen_loss - lf) / abs(lf)
    print(f"step 1 gradients per tensor against fp32 (loss {lf:.6f}, cpgen {cpgen_loss:.6f}): cosine similarity "
          f"and relative norm error")
    print(f"  {'tensor':<46} {'|g| fp32':>10} {'cosine':>10} {'norm err':>9}")
    fp = dict(ref.named_parameters())
    worst_cos, worst_nerr, sq = 1.0, 0.0, [0.0, 0.0]
    for name in names:
        gr = fp[name].grad.float().flatten()
        gc = gref[name].to(dev).float().flatten()
        nr, nc = float(gr.norm()), float(gc.norm())
        sq = [sq[0] + nr * nr, sq[1] + nc * nc]
        cos = float(F.cosine_similarity(gc, gr, dim=0))
        nerr = abs(nc - nr) / max(nr, 1e-30)
        worst_cos, worst_nerr = min(worst_cos, cos), max(worst_nerr, nerr)
        print(f"  {name:<46} {nr:>10.4e} {cos:>10.6f} {nerr:>9.2e}")
    print(f"  global norm: fp32 {math.sqrt(sq[0]):.5f}, cpgen {math.sqrt(sq[1]):.5f}")
    with torch.no_grad():
        for p, w in zip(ref.parameters(), saved):
            p.copy_(w)
    ref.zero_grad(set_to_none=True)
    return rel, worst_cos, worst_nerr


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "hf"
    run = json.load(open(f"{d}/run.json"))
    ours = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
    steps, mb, T = run["steps"], run["micro_batches"], run["seq_len"]
    # a cpgen run cut short compares fewer steps, which must not pass for agreement
    n = min(steps, CURVE_STEPS)
    have = [r.get("step") for r in ours]
    if have[:n] != list(range(1, n + 1)):
        print(f"cpgen's metrics.jsonl holds steps {have[:3]}...{have[-3:]} ({len(have)} lines), not 1 to {n}")
        print("MISMATCH")
        return 1
    raw = torch.frombuffer(bytearray(open(f"{d}/tokens.bin", "rb").read()), dtype=torch.int32)
    raw = raw.view(steps, mb, 2, T).long()
    dev = "cuda"
    torch.manual_seed(0)
    ref = load(d, dev)  # fp32 weights, fp32 compute
    names = [n for n, _ in ref.named_parameters()]
    gref = {}
    for f in sorted(glob.glob(f"{d}/grads/*.safetensors")):
        from safetensors.torch import load_file
        gref.update(load_file(f))
    # cpgen's loss of step 1, the step its gradients are of
    loss1 = json.load(open(f"{d}/grads/loss.json"))["loss"] if gref else None
    grad_check = check_gradients(ref, names, gref, raw, loss1, dev) if gref else None

    mixed = load(d, dev)  # cpgen's precision: bf16 compute copies of fp32 masters
    master = [p.detach().clone().requires_grad_(True) for p in mixed.parameters()]
    mixed = mixed.to(torch.bfloat16)
    hp = dict(lr=run["lr"], betas=(run["beta1"], run["beta2"]), eps=run["eps"], weight_decay=run["weight_decay"])
    opt_ref, opt_mixed = torch.optim.AdamW(list(ref.parameters()), **hp), torch.optim.AdamW(master, **hp)
    print(f"{len(names)} tensors, {sum(p.numel() for p in master):,} parameters; {steps} steps of {mb} x {T} tokens")
    print(f"{'step':>4} {'lr':>9} {'loss cpgen':>11} {'loss fp32':>11} {'rel':>9} {'loss bf16':>11} {'rel':>9} "
          f"{'norm cpgen':>11} {'norm fp32':>11}")
    worst, worst_mixed = 0.0, 0.0
    for s in range(min(steps, CURVE_STEPS)):
        lr = run["lrs"][s]
        n = int((raw[s, :, 1] >= 0).sum())
        for opt in (opt_ref, opt_mixed):
            for g in opt.param_groups:
                g["lr"] = lr
        # fp32 reference
        ref.zero_grad(set_to_none=True)
        loss = forward_backward(ref, raw, s, n, dev)
        norm, scale = clip_grads([p.grad for p in ref.parameters()], run["clip"])
        for p in ref.parameters():
            p.grad.mul_(scale)
        opt_ref.step()
        # mixed precision
        mixed.zero_grad(set_to_none=True)
        loss_mixed = forward_backward(mixed, raw, s, n, dev)
        grads = [p.grad.float() for p in mixed.parameters()]
        _, scale = clip_grads(grads, run["clip"])
        for m, g in zip(master, grads):
            m.grad = g * scale
        opt_mixed.step()
        with torch.no_grad():
            for p, m in zip(mixed.parameters(), master):
                p.copy_(m.to(torch.bfloat16))
        cl, cn = ours[s]["loss"], ours[s]["norm"]
        rl, rm = abs(cl - loss) / abs(loss), abs(cl - loss_mixed) / abs(loss_mixed)
        worst, worst_mixed = max(worst, rl), max(worst_mixed, rm)
        print(f"{s + 1:>4} {lr:>9.2e} {cl:>11.5f} {loss:>11.5f} {rl:>9.2e} {loss_mixed:>11.5f} {rm:>9.2e} "
              f"{cn:>11.5f} {norm:>11.5f}")
    ok = worst <= 1e-2
    print(f"loss curve over {min(steps, CURVE_STEPS)} steps: worst relative difference to fp32 {worst:.2e} "
          f"(bound 1e-2); to torch's mixed precision {worst_mixed:.2e}")
    if grad_check:
        rel, cos, nerr = grad_check
        ok = ok and rel <= 1e-3 and cos >= 0.999 and nerr <= 1e-2
        print(f"step 1 against fp32: loss {rel:.2e} (bound 1e-3); gradients: worst cosine {cos:.6f} (bound 0.999), "
              f"worst norm error {nerr:.2e} (bound 1e-2)")
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
