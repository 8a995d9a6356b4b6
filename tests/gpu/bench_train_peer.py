#!/usr/bin/env python3
"""bench_train_peer.py: the peer cpgen's one-GPU training is measured against. A transformers Llama with the
shape of a cpgen spec, trained the way a careful PyTorch user would on one GPU: gradient checkpointing, SDPA
attention, fp32 master weights under bf16 autocast, fused AdamW. Prints one line per sequence length:

    peer seq 16384: 12,034 tok/s | step 1.361 s | peak 61.2 GiB allocated, 63.0 GiB reserved
    peer seq 65536: OOM

usage: bench_train_peer.py --plan-json PLAN.json --seq 16384,32768,65536 [--steps 3] [--warmup 1]
PLAN.json is `cpgen plan SPEC --json` (its model section gives the shape). Needs torch and transformers."""
import argparse
import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build(model_json, seq):
    m = model_json
    kw = dict(vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
              num_hidden_layers=m["layers"], num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
              head_dim=m["head_dim"], rms_norm_eps=m["norm_eps"], rope_theta=m["rope_theta"],
              tie_word_embeddings=m["tie_embeddings"], max_position_embeddings=max(seq, 8192),
              attn_implementation="sdpa")
    rs = m.get("rope_scaling")
    if rs:
        kw["rope_scaling"] = {"rope_type": "llama3", "factor": rs["factor"], "low_freq_factor": rs["low_freq"],
                              "high_freq_factor": rs["high_freq"],
                              "original_max_position_embeddings": rs["original_max"]}
    cfg = LlamaConfig(**kw)
    cfg.use_cache = False
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)  # fp32 master weights
    model.gradient_checkpointing_enable()
    model.train()
    return model


def run(model_json, seq, steps, warmup):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build(model_json, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    times = []
    for step in range(warmup + steps):
        ids = torch.randint(0, model_json["vocab"], (1, seq), device="cuda", generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    alloc = torch.cuda.max_memory_allocated() / 2**30
    reserved = torch.cuda.max_memory_reserved() / 2**30
    del model, opt
    return med, alloc, reserved


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan-json", required=True)
    ap.add_argument("--seq", required=True, help="comma-separated sequence lengths in tokens")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    with open(a.plan_json) as f:
        model_json = json.load(f)["model"]
    torch.backends.cuda.matmul.allow_tf32 = False
    for seq in [int(s) for s in a.seq.split(",")]:
        try:
            med, alloc, reserved = run(model_json, seq, a.steps, a.warmup)
            print(f"peer seq {seq}: {seq / med:,.0f} tok/s | step {med:.3f} s | peak {alloc:.1f} GiB allocated, "
                  f"{reserved:.1f} GiB reserved", flush=True)
        except torch.cuda.OutOfMemoryError:
            print(f"peer seq {seq}: OOM", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
