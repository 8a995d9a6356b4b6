#!/usr/bin/env python3
"""bench_attention_sdpa.py: the attention benchmark's shapes (causal, --head-dim D, the query/KV heads of --shapes)
through torch.nn.functional.scaled_dot_product_attention with the FLASH_ATTENTION and CUDNN_ATTENTION backends: median
forward time and median backward time (fwd+bwd minus fwd) over --reps runs with CUDA events. bench_attention runs this
with its own list of shapes (--shapes 32/32,32/8,64/8 by default: the list lives in bench_attention.c alone) and
prints it beside its own numbers; the lines "SDPA <backend> <qh> <kvh> <fwd_ms> <bwd_ms>" are for it to read.
Inputs are in the head layout [S][H][D] (SDPA sees the [1][H][S][D] transposed view, as in HF models). A backend that
does not take enable_gqa gets K and V repeated per query head (said so in the output)."""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, reps):
    ts = []
    for i in range(reps + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 2:
            ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def run(backend, S, QH, KVH, D, reps):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: (torch.rand(S, h, D, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    q, k, v, do = mk(QH), mk(KVH), mk(KVH), mk(QH)
    note = ""
    kw = {"enable_gqa": True}
    view = lambda t: t.transpose(0, 1)[None]
    qv, kv_, vv = view(q).requires_grad_(True), view(k).requires_grad_(True), view(v).requires_grad_(True)
    dov = view(do)
    with sdpa_kernel([backend]):
        try:
            F.scaled_dot_product_attention(qv, kv_, vv, is_causal=True, **kw)
        except RuntimeError:
            if KVH == QH:
                raise
            kw = {}
            kv_ = view(k.repeat_interleave(QH // KVH, dim=1)).detach().requires_grad_(True)
            vv = view(v.repeat_interleave(QH // KVH, dim=1)).detach().requires_grad_(True)
            note = " (K, V repeated: no enable_gqa in this backend)"

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(qv, kv_, vv, is_causal=True, **kw)

        def fwdbwd():
            o = F.scaled_dot_product_attention(qv, kv_, vv, is_causal=True, **kw)
            o.backward(dov)

        f = timed(fwd, reps)
        fb = timed(fwdbwd, reps)
    return f, fb - f, note


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--cudnn-only", action="store_true", help="leave out the FLASH_ATTENTION backend")
    ap.add_argument("--shapes", required=True,
                    help="query/KV heads, comma-separated, e.g. 32/32,32/8,64/8 (bench_attention passes its own)")
    a = ap.parse_args()
    S, D = a.seq, a.head_dim
    try:
        shapes = [tuple(int(h) for h in x.split("/")) for x in a.shapes.split(",") if x]
        if not shapes or any(len(t) != 2 or min(t) < 1 or t[0] % t[1] for t in shapes):
            raise ValueError
    except ValueError:
        print(f"bench_attention_sdpa.py: --shapes takes QH/KVH, comma-separated, KVH dividing QH: not {a.shapes!r}")
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for qh, kvh in shapes:
        backends = (SDPBackend.CUDNN_ATTENTION,) if a.cudnn_only else (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION)
        for be in backends:
            try:
                f, b, note = run(be, S, qh, kvh, D, a.reps)
            except Exception as e:  # a backend missing on this machine is reported, not fatal
                print(f"{be.name} {qh}/{kvh}: not run: {str(e).splitlines()[0][:160]}")
                continue
            F_ = 4.0 * S * S * qh * D / 2
            print(f"{be.name:16} {qh}/{kvh}: fwd {f:8.3f} ms ({F_ / f / 1e9:6.1f} TF/s), bwd {b:8.3f} ms "
                  f"({2.5 * F_ / b / 1e9:6.1f} TF/s){note}")
            print(f"SDPA {be.name} {qh} {kvh} {f:.4f} {b:.4f}", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
