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
# Packed documents (run.json: doc_mask, doc_positions, eod; data.documents = "mask", docs/DATA.md): the documents are
# cut from the tokens as cpgen cuts them (runtime/data.h cp_docs_from_tokens: a document starts at position 0 and at
# p + 1 for every p < S - 1 holding the end-of-document id), and transformers gets the same packed sequences with
# position_ids restarting at every document start (with doc_positions) and attention confined to each document by a
# 4D block-diagonal causal mask; targets at end-of-document positions are ignored. It also fails when:
#   - cpgen's targets score an end-of-document position;
#   - the reference itself is not the documents run alone: step 1's fp32 loss summed over its documents, each run as
#     a sequence of its own, differs from the packed loss by more than 1e-5 (relative). This proves the mask and the
#     positions transformers is given before cpgen is compared with it.
import glob
import json
import math
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

CURVE_STEPS = 20  # the loss curves must agree within 1% at each of these steps


IGNORE = -100  # the ignored target, as transformers' collators write it (cpgen's -1 and end-of-document positions)
ALONE_BOUND = 1e-5  # packed loss against its documents run alone, fp32


class Packing:
    """How cpgen cut the sequences (run.json; absent keys: one document, positions along the sequence)."""

    def __init__(self, run):
        self.mask = bool(run.get("doc_mask", False))
        self.positions = bool(run.get("doc_positions", False))
        self.eod = int(run.get("eod", -1)) if self.mask else -1

    def documents(self, tok):
        """(first, doc): the documents' first positions, ascending, and each position's document index, as
        runtime/data.c cp_docs_from_tokens: position 0 starts one, and p + 1 does where tok[p] is eod (p < S - 1)."""
        start = torch.zeros_like(tok, dtype=torch.bool)
        start[0] = True
        if self.eod >= 0:
            start[1:] = tok[:-1] == self.eod
        return torch.nonzero(start).flatten(), torch.cumsum(start.long(), 0) - 1

    def inputs(self, tok):
        """The model's keyword arguments for one sequence tok[S] (on the GPU)."""
        if not self.mask and not self.positions:
            return {"input_ids": tok[None]}
        first, doc = self.documents(tok)
        ar = torch.arange(tok.numel(), device=tok.device)
        # as transformers' packed-batch collators write them: restarting at 0 at every document start
        pos = ar - first[doc] if self.positions else ar
        kw = {"input_ids": tok[None], "position_ids": pos[None]}
        if self.mask:
            # [1, 1, S, S], True = attend: key j for query i iff j <= i and both lie in one document. A 4D mask is
            # taken as given (transformers' masking_utils: _preprocess_mask_arguments returns a 4D attention_mask
            # as-is, create_causal_mask makes none of its own and the position_ids are not searched for packing);
            # the sdpa path (integrations/sdpa_attention.py) repeats K and V for GQA and passes it to
            # F.scaled_dot_product_attention as attn_mask with is_causal False (set only without a mask). A boolean
            # mask is right there in fp32 and bf16 alike; the eager path would add it to the scores (it needs an
            # additive mask) and would hold heads x S x S fp32 scores per layer, 34 GB at 16K with 32 heads.
            kw["attention_mask"] = ((doc[:, None] == doc[None, :]) & (ar[None, :] <= ar[:, None]))[None, None]
        return kw

    def targets(self, raw):
        """raw[..., 1, :] with every ignored target IGNORE and, with the mask, end-of-document positions ignored;
        returns how many end-of-document positions cpgen's targets scored (it must be none)."""
        tok, tgt = raw[..., 0, :], raw[..., 1, :]
        tgt[tgt < 0] = IGNORE
        scored = 0
        if self.eod >= 0:
            at_eod = tok == self.eod
            scored = int((at_eod & (tgt != IGNORE)).sum())
            tgt[at_eod] = IGNORE
        return scored


def masked_call(model, kw):
    """The model on kw; where kw holds the 4D document mask, on sdpa's memory-efficient kernel only: it takes the mask
    without materialising the scores (transformers repeats K and V for it where a mask is given), and where it cannot
    run the comparison fails saying so rather than falling back to the math kernel, which holds heads x S x S fp32
    scores per layer for the backward (32 GiB a layer at 16K with 32 heads). Calls without a mask choose freely:
    there transformers passes GQA to sdpa as is, which the memory-efficient kernel does not take."""
    if "attention_mask" not in kw:
        return model(**kw)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        return model(**kw)


def causal(tok, pos=None):
    """The model's inputs for tok run causally as one sequence (positions pos, else along it), the causal mask given
    as a 4D mask so that masked_call keeps it on the memory-efficient kernel (a whole 16K sequence in fp32 would
    otherwise go to the math kernel, which GQA without a mask needs)."""
    ar = torch.arange(tok.numel(), device=tok.device)
    kw = {"input_ids": tok[None], "attention_mask": (ar[None, :] <= ar[:, None])[None, None]}
    if pos is not None:
        kw["position_ids"] = pos[None]
    return kw


def load(d, dev, pk):
    # packed documents: sdpa with a 4D boolean mask (Packing.inputs says why); otherwise eager, causal
    return AutoModelForCausalLM.from_pretrained(f"{d}/model", torch_dtype=torch.float32,
                                                attn_implementation="sdpa" if pk.mask else "eager").to(dev)


def forward_backward(model, raw, s, n, dev, pk):
    """Loss of step s over its micro-batches (sum of token losses / n); gradients accumulate in model."""
    total = 0.0
    for b in range(raw.shape[1]):
        logits = masked_call(model, pk.inputs(raw[s, b, 0].to(dev))).logits[0].float()
        ls = F.cross_entropy(logits, raw[s, b, 1].to(dev), ignore_index=IGNORE, reduction="sum")
        (ls / n).backward()
        total += ls.item()
    return total / n


def check_alone(model, raw, pk, dev):
    """Step 1's fp32 loss (sum over its micro-batches' target tokens) packed against its documents run one by one, each
    a sequence of its own (its positions as packed, no mask: causal alone). Returns the relative difference."""
    packed = alone = plain = 0.0
    lens, runs = [], 0
    with torch.no_grad():
        for b in range(raw.shape[1]):
            tok, tgt = raw[0, b, 0].to(dev), raw[0, b, 1].to(dev)
            kw = pk.inputs(tok)
            packed += F.cross_entropy(masked_call(model, kw).logits[0].float(), tgt, ignore_index=IGNORE,
                                      reduction="sum").item()
            # the same sequence as one document, positions along it: how far off a reference without the mask is
            plain += F.cross_entropy(masked_call(model, causal(tok)).logits[0].float(), tgt, ignore_index=IGNORE,
                                     reduction="sum").item()
            first, _ = pk.documents(tok)
            bounds = first.tolist() + [tok.numel()]
            pos = kw["position_ids"][0]
            for a, e in zip(bounds[:-1], bounds[1:]):
                lens.append(e - a)
                if not bool((tgt[a:e] != IGNORE).any()):
                    continue  # nothing scored (a document of its end alone)
                logits = masked_call(model, causal(tok[a:e], pos[a:e])).logits[0].float()
                alone += F.cross_entropy(logits, tgt[a:e], ignore_index=IGNORE, reduction="sum").item()
                runs += 1
    rel = abs(packed - alone) / abs(alone) if alone else math.inf
    print(f"documents of step 1: {len(lens)} in {raw.shape[1]} sequences (lengths {min(lens)} to {max(lens)}, mean "
          f"{sum(lens) / len(lens):.1f}; {sum(1 for l in lens if l == 1)} of 1 token), positions "
          f"{'restarting at each' if pk.positions else 'along the sequence'}, end-of-document id {pk.eod}")
    print(f"documents alone against packed (fp32, summed token losses): {alone:.6f} over {runs} runs, packed "
          f"{packed:.6f}: {rel:.2e} (bound {ALONE_BOUND:.0e}); unmasked {plain:.6f} "
          f"({abs(plain - alone) / abs(alone) if alone else math.inf:.2e} off)")
    return rel


def clip_grads(grads, clip):
    norm = math.sqrt(sum(float((g.float() * g.float()).sum()) for g in grads))
    return norm, (min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0)


def check_gradients(ref, names, gref, raw, cpgen_loss, dev, pk):
    """Step 1 against fp32: ref computes with the bf16-rounded weights cpgen computes with, over step 1's micro-batches.
    Returns (loss relative difference, worst cosine, worst norm error)."""
    saved = [p.detach().clone() for p in ref.parameters()]
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    lf = forward_backward(ref, raw, 0, int((raw[0, :, 1] >= 0).sum()), dev, pk)
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
    pk = Packing(run)
    eod_scored = pk.targets(raw)
    dev = "cuda"
    torch.manual_seed(0)
    ref = load(d, dev, pk)  # fp32 weights, fp32 compute
    alone = check_alone(ref, raw, pk, dev) if pk.mask else None
    names = [n for n, _ in ref.named_parameters()]
    gref = {}
    for f in sorted(glob.glob(f"{d}/grads/*.safetensors")):
        from safetensors.torch import load_file
        gref.update(load_file(f))
    # cpgen's loss of step 1, the step its gradients are of
    loss1 = json.load(open(f"{d}/grads/loss.json"))["loss"] if gref else None
    grad_check = check_gradients(ref, names, gref, raw, loss1, dev, pk) if gref else None

    mixed = load(d, dev, pk)  # cpgen's precision: bf16 compute copies of fp32 masters
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
        loss = forward_backward(ref, raw, s, n, dev, pk)
        norm, scale = clip_grads([p.grad for p in ref.parameters()], run["clip"])
        for p in ref.parameters():
            p.grad.mul_(scale)
        opt_ref.step()
        # mixed precision
        mixed.zero_grad(set_to_none=True)
        loss_mixed = forward_backward(mixed, raw, s, n, dev, pk)
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
    if pk.mask:
        ok = ok and alone <= ALONE_BOUND and eod_scored == 0
        print(f"packed documents: the reference against its documents alone {alone:.2e} (bound {ALONE_BOUND:.0e}); "
              f"end-of-document positions cpgen scored: {eod_scored} (must be 0)")
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
