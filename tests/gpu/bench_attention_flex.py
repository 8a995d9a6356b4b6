#!/usr/bin/env python3
"""bench_attention_flex.py: the peer of `bench_attention --docs LEN` (document-masked causal attention): PyTorch
FlexAttention (torch.nn.attention.flex_attention, compiled with torch.compile) with a document block mask made by
create_block_mask, on bench_attention's shapes (--head-dim D, 32 query heads, 32 or 8 KV heads; GQA through
enable_gqa), bf16, for each --docs length: documents of LEN tokens, the last one shorter when S is not a multiple of
LEN, causal within each document (a key j for query i iff j <= i and both in one document), as bench_attention
--docs lays them out (doc_start[i] = i / LEN * LEN).
Times: median over --reps runs with CUDA events after two warm-up runs (and the calls that compile), forward under
no_grad, backward = forward+backward minus forward (as bench_attention_sdpa.py; it includes FlexAttention's own
delta = rowsum(dO * O), which bench_attention computes outside its timed backward). TF/s are counted on the scores
kept, as bench_attention --docs counts them: kept = sum over documents of L (L + 1) / 2 per head, forward
4 * kept * H * D, backward 2.5 times that.
Inputs are [1][H][S][D] contiguous (FlexAttention's own layout), uniform in [-1, 1).
Prints a table in bench_attention's format and the lines "FLEX <qh> <kvh> <len> <fwd_ms> <bwd_ms>" for
tools/gpu-docs-bench.sh to read. Exit 0, or 1 when a run failed (FlexAttention missing, a compile error, NaN out)."""
import argparse
import inspect
import sys

import torch

from bench_attention_sdpa import timed  # the same timing as the SDPA peer: warm-up, CUDA events, median


def kept_scores(S, length):
    """Scores kept per head by causal attention over documents of length tokens (the last one shorter) in S."""
    n = 0
    for a in range(0, S, length):
        l = min(length, S - a)
        n += l * (l + 1) // 2
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--docs", default="4096,8192,32768", help="document lengths, comma-separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--shapes", default="32/32,32/8", help="query/KV heads, comma-separated")
    a = ap.parse_args()
    S, D, reps = a.seq, a.head_dim, max(a.reps, 1)
    lens = [int(x) for x in a.docs.split(",") if x]
    shapes = [tuple(int(h) for h in x.split("/")) for x in a.shapes.split(",") if x]
    if not lens or min(lens) < 1 or any(qh % kvh for qh, kvh in shapes):
        print("bench_attention_flex.py: --docs takes lengths of at least 1, --shapes QH/KVH with KVH dividing QH")
        return 2
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        print(f"FAILED: no FlexAttention in torch {torch.__version__}: {e}")
        return 1
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")

    # One mask_mod for every length: it reads the documents from one buffer refilled per length, so that the
    # compiled mask builder and attention are not traced again for each (their guards see the same tensor).
    doc = torch.zeros(S, dtype=torch.int32, device="cuda")

    def document_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    # The block mask from the mask_mod, compiled: uncompiled it would hold S x S elements (and index tensors) at once.
    if "_compile" in inspect.signature(create_block_mask).parameters:
        make_mask = lambda: create_block_mask(document_causal, None, None, S, S, device="cuda", _compile=True)
    else:
        cbm = torch.compile(create_block_mask)
        make_mask = lambda: cbm(document_causal, None, None, S, S, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)

    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: (torch.rand(1, h, S, D, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    results, failed = [], 0
    for length in lens:
        doc.copy_(torch.arange(S, device="cuda", dtype=torch.int32) // length)
        mask = make_mask()
        kept = kept_scores(S, length)
        print(f"\ndocuments of {length} tokens: {100 * kept / (S * (S + 1) / 2):.2f}% of the causal scores kept; "
              f"block mask {mask.shape}, {mask.sparsity():.2f}% of its blocks skipped")
        for qh, kvh in shapes:
            name = f"{'MHA' if qh == kvh else 'GQA'} {qh}/{kvh}"
            try:
                q, k, v, do = mk(qh), mk(kvh), mk(kvh), mk(qh)
                q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
                gqa = qh != kvh

                def fwd():
                    with torch.no_grad():
                        return flex(q, k, v, block_mask=mask, enable_gqa=gqa)

                def fwdbwd():
                    o = flex(q, k, v, block_mask=mask, enable_gqa=gqa)
                    o.backward(do)

                o = fwd()  # compiles
                fwdbwd()
                torch.cuda.synchronize()
                bad = int(torch.isnan(o).sum()) + int(torch.isnan(q.grad).sum())
                if bad:
                    raise RuntimeError(f"{bad} NaN in the output and dQ")
                f = timed(fwd, reps)
                fb = timed(fwdbwd, reps)
            except Exception as e:  # the table would lack this row: a failure, said so
                print(f"FAILED: {name}, documents of {length}: {str(e).splitlines()[0][:200] if str(e) else repr(e)}")
                failed += 1
                continue
            finally:
                q = k = v = do = o = None
                torch.cuda.empty_cache()
            b = fb - f
            results.append((name, qh, kvh, length, kept, f, b))
            print(f"  {name} flex docs: fwd median {f:.3f} ms, bwd {b:.3f} ms over {reps} runs")
            print(f"FLEX {qh} {kvh} {length} {f:.4f} {b:.4f}", flush=True)

    for length in lens:
        kept = kept_scores(S, length)
        print(f"\ncausal attention over documents of {length} tokens, S={S}, D={D}: {100 * kept / (S * (S + 1) / 2):.2f}% "
              f"of the causal scores kept;\nTF/s = fwd 4*kept*H*D, bwd 2.5x fwd")
        print(f"{'shape':<10} {'kernel':<18} {'fwd ms':>9} {'bwd ms':>9} {'fwd TF/s':>8} {'bwd TF/s':>8}")
        for name, qh, kvh, l, kept, f, b in results:
            if l != length:
                continue
            F = 4.0 * kept * qh * D
            print(f"{name:<10} {'flex docs':<18} {f:9.3f} {b:9.3f} {F / f / 1e9:8.1f} {2.5 * F / b / 1e9:8.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
