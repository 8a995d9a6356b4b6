#!/usr/bin/env python3
"""hf_val_loss.py: the validation loss of a cpgen checkpoint, computed by transformers on the held-out sequences cpgen
evaluates, so that two runs' weights are judged by one forward that neither trained with.

Reads CKPT (a training checkpoint's folder, `ckpt_<step>`: config.json and the fp32 weights, which transformers
loads) and the shards of VAL_GLOB (sorted by name, as cpgen reads `data.val = "tokens:<glob>"`), and cuts the first
N sequences of SEQ + 1 tokens as cpgen does (docs/DATA.md): sequence n of a shard starts at n * SEQ, a shard holds
(count - 1) // SEQ of them, a sequence never crosses shards. Where the shards carry an end-of-document id (the
default data.documents = "mask", data.positions = "document") each sequence is cut into its documents (one starts at
position 0 and after every end-of-document token before the last position) and each document runs alone, its
positions from 0, which is what cpgen's masks and positions compute; the target of an end-of-document token is none.
Without an id each sequence runs whole. The loss is the sum of cross-entropy over every target, divided by their
number, in fp32 from the model's logits: the number cpgen prints as `val loss`.
Each DTYPE (bf16: the weights rounded to bf16, cpgen's mixed precision; fp32: the weights as saved, TF32 off) prints
one JSON line: {"dtype", "loss", "targets", "sequences", "documents", "seconds"}. Exit 1 when a shard or the
checkpoint cannot be read or the shards hold fewer than N sequences, 2 on wrong arguments.
usage: hf_val_loss.py CKPT VAL_GLOB SEQ N [DTYPE ...]"""
import array
import glob
import json
import math
import os
import struct
import sys
import time

MAGIC = b"CPGTOK01"


def fail(msg):
    print(f"hf_val_loss: {msg}", file=sys.stderr)
    sys.exit(1)


def shard_header(path):
    """(token bytes, token count, end-of-document id or -1) of one shard, checked as cpgen checks it"""
    try:
        with open(path, "rb") as f:
            head = f.read(32)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if len(head) != 32 or head[:8] != MAGIC:
        fail(f"{path}: not a cpgen token shard (no {MAGIC.decode()} header)")
    version, width, count, eod1 = struct.unpack("<IIQQ", head[8:32])
    if version not in (1, 2) or width not in (2, 4):
        fail(f"{path}: version {version}, token bytes {width}: not a shard this tool reads")
    if size != 32 + count * width:
        fail(f"{path}: the header says {count} tokens, the file holds {(size - 32) / width:g}")
    return width, count, (int(eod1) - 1 if version == 2 else -1)


def shard_tokens(path, width):
    toks = array.array("H" if width == 2 else "I")
    with open(path, "rb") as f:
        f.seek(32)
        toks.frombytes(f.read())
    if sys.byteorder != "little":
        toks.byteswap()
    return toks


def sequences(pattern, seq, n):
    """the first n sequences of seq + 1 tokens of the stream, and the end-of-document id (-1: none)"""
    paths = sorted(glob.glob(pattern))
    if not paths:
        fail(f"no shard matches {pattern}")
    heads = [shard_header(p) for p in paths]
    eods = sorted({e for _, _, e in heads})
    if len(eods) != 1:
        fail(f"the shards of {pattern} disagree on the end-of-document id: {eods}")
    out = []
    for p, (width, count, _) in zip(paths, heads):
        k = min((count - 1) // seq, n - len(out))  # an empty shard gives -1: none
        if k > 0:
            toks = shard_tokens(p, width)
            out += [toks[i * seq : i * seq + seq + 1] for i in range(k)]
        if len(out) == n:
            return out, eods[0]
    fail(f"{pattern} holds {len(out)} sequences of {seq} + 1 tokens, {n} asked for")


def documents(s, eod):
    """[(start, end)) of each document of the sequence's first len(s) - 1 positions"""
    S = len(s) - 1
    if eod < 0:
        return [(0, S)]
    starts = [0] + [p + 1 for p in range(S - 1) if s[p] == eod]
    return list(zip(starts, starts[1:] + [S]))


def loss_of(model, seqs, eod):
    import torch
    import torch.nn.functional as F

    dev = next(model.parameters()).device
    total, targets, docs = 0.0, 0, 0
    with torch.no_grad():
        for s in seqs:
            t = torch.tensor(s, dtype=torch.long, device=dev)
            for a, b in documents(s, eod):
                x = t[a:b].unsqueeze(0)
                y = t[a + 1 : b + 1].clone()
                if eod >= 0:
                    y[t[a:b] == eod] = -100  # the target of an end-of-document token is none
                pos = torch.arange(b - a, device=dev).unsqueeze(0)
                logits = model(input_ids=x, position_ids=pos).logits[0].float()
                total += F.cross_entropy(logits, y, ignore_index=-100, reduction="sum").item()
                targets += int((y != -100).sum())
                docs += 1
    return total, targets, docs


def main(argv):
    if len(argv) < 5:
        print(__doc__)
        return 2
    ckpt, pattern, dtypes = argv[1], argv[2], argv[5:] or ["bf16"]
    seq, n = (int(a) if a.isdigit() else 0 for a in argv[3:5])
    if any(d not in ("bf16", "fp32") for d in dtypes) or seq < 1 or n < 1:
        print(__doc__)
        return 2
    seqs, eod = sequences(pattern, seq, n)  # the data first: a wrong glob fails before the model loads
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for d in dtypes:
        t0 = time.time()
        try:
            model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16 if d == "bf16" else torch.float32)
        except (OSError, ValueError) as e:
            fail(f"{ckpt}: transformers cannot load it: {e}")
        model.to("cuda").eval()
        total, targets, docs = loss_of(model, seqs, eod)
        del model
        torch.cuda.empty_cache()
        loss = total / targets if targets else math.nan
        print(json.dumps({"dtype": d, "loss": loss, "targets": targets, "sequences": n, "documents": docs,
                          "seconds": round(time.time() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
