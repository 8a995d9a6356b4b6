#!/usr/bin/env python3
"""attention_sdpa.py: PyTorch oracle for the attention kernels. Runs build/tests/gpu/test_attention --dump on one
shape (fresh random inputs), loads what our kernels produced, and compares forward (o, lse) and backward (dq, dk, dv)
with torch.nn.functional.scaled_dot_product_attention (enable_gqa) computed in float32 from the same bf16 inputs.
PyTorch's own bf16 result (default backend) is compared with the same float32 reference, for scale.

usage: attention_sdpa.py [--bin build/tests/gpu/test_attention] [--seq 4096] [--heads 32] [--kv-heads 8]
                         [--head-dim 128] [--causal 1|0] [--dir DIR]
Exit status 1 when any of our relative errors exceeds 1e-2 (or is NaN); 77 (skipped) when test_attention skips
(no GPU), as the GPU tests do."""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F


def load_bf16(path, shape):
    raw = np.fromfile(path, dtype=np.uint16).astype(np.int32) << 16
    return torch.from_numpy(raw.view(np.float32).reshape(shape).copy())


def rel(out, ref):
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return float("nan")
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def sdpa(q, k, v, causal):
    """q [S][QH][D], k, v [S][KVH][D] -> o [S][QH][D] (and the graph for backward)."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=causal, enable_gqa=True)
    return o[0].transpose(0, 1)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "tests", "gpu", "test_attention"))
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    S, QH, KVH, D, causal = a.seq, a.heads, a.kv_heads, a.head_dim, bool(a.causal)
    d = a.dir or tempfile.mkdtemp(prefix="attn_sdpa_")
    os.makedirs(d, exist_ok=True)
    cmd = [a.bin, "--dump", d, str(S), str(QH), str(KVH), str(D), str(int(causal))]
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd)
    if r.returncode == 77:  # its own line said why
        print("attention_sdpa.py: skipped: test_attention --dump was skipped")
        return 77
    if r.returncode != 0:
        print(f"attention_sdpa.py: test_attention --dump failed with status {r.returncode}")
        return 1

    dev = "cuda"
    q = load_bf16(f"{d}/q.bin", (S, QH, D)).to(dev)
    k = load_bf16(f"{d}/k.bin", (S, KVH, D)).to(dev)
    v = load_bf16(f"{d}/v.bin", (S, KVH, D)).to(dev)
    do = load_bf16(f"{d}/dout.bin", (S, QH, D)).to(dev)
    ours = {n: load_bf16(f"{d}/{n}.bin", s).to(dev) for n, s in
            [("o", (S, QH, D)), ("dq", (S, QH, D)), ("dk", (S, KVH, D)), ("dv", (S, KVH, D))]}
    ours["lse"] = torch.from_numpy(np.fromfile(f"{d}/lse.bin", dtype=np.float32).reshape(QH, S)).to(dev)

    # float32 reference from the same (bf16-valued) inputs, on the math backend
    from torch.nn.attention import SDPBackend, sdpa_kernel
    x = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        o32 = sdpa(*x, causal)
    o32.backward(do)
    ref = {"o": o32.detach(), "dq": x[0].grad, "dk": x[1].grad, "dv": x[2].grad}
    # lse in float64 straight from the scores, per query head
    g = QH // KVH
    lse = torch.empty(QH, S, dtype=torch.float64, device=dev)
    for h in range(QH):
        s = (q[:, h].double() @ k[:, h // g].double().T) / math.sqrt(D)
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool, device=dev), 1), float("-inf"))
        lse[h] = torch.logsumexp(s, dim=1)
    ref["lse"] = lse

    # PyTorch's own bf16 kernels against the same reference
    xb = [t.to(torch.bfloat16).clone().requires_grad_(True) for t in (q, k, v)]
    ob = sdpa(*xb, causal)
    ob.backward(do.to(torch.bfloat16))
    torch_bf16 = {"o": ob.detach(), "dq": xb[0].grad, "dk": xb[1].grad, "dv": xb[2].grad}

    print(f"\nS={S} QH={QH} KVH={KVH} D={D} {'causal' if causal else 'full'}: relative error in norm vs float32 SDPA")
    print(f"{'output':8} {'cpgen':>12} {'torch bf16':>12}")
    bad = False
    for n in ("o", "lse", "dq", "dk", "dv"):
        e = rel(ours[n], ref[n])
        t = rel(torch_bf16[n], ref[n]) if n in torch_bf16 else float("nan")
        bound = 1e-4 if n == "lse" else 1e-2
        ok = e == e and e <= bound
        bad |= not ok
        print(f"{n:8} {e:12.3e} {t:12.3e}  {'ok' if ok else 'FAIL'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
