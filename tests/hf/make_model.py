#!/usr/bin/env python3
"""make_model.py: the Hugging Face oracle's model. Builds a LlamaForCausalLM or Qwen3ForCausalLM with transformers
from a cpgen spec's numbers, initialised from a fixed seed, and saves it (safetensors + config.json) for the GPU
tests to load with cpgen (`init = { from = "hf", path = ... }`) and compare against transformers.

    python3 tests/hf/make_model.py --out /tmp/tiny_hf --family llama --vocab 512 --hidden 256 --layers 2 \
        --heads 4 --kv-heads 2 --head-dim 64 --ffn 768
    build/cpgen plan specs/tiny.lua --json > /tmp/plan.json
    python3 tests/hf/make_model.py --out /tmp/tiny_hf --plan-json /tmp/plan.json --rope-theta 10000

Flags given on the command line win over the plan JSON. Needs torch and transformers (4.4x or 5.x)."""
import argparse
import inspect
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder to save the model into")
    ap.add_argument("--plan-json", help="output of `cpgen plan <spec> --json`: its model section")
    ap.add_argument("--family", choices=["llama", "qwen3"])
    for name in ["vocab", "hidden", "layers", "heads", "kv-heads", "head-dim", "ffn"]:
        ap.add_argument("--" + name, type=int)
    ap.add_argument("--tie", action=argparse.BooleanOptionalAction, default=None, help="tie the LM head")
    ap.add_argument("--norm-eps", type=float)
    ap.add_argument("--rope-theta", type=float)
    ap.add_argument("--rope-scaling", help="llama3 scaling: factor,low_freq,high_freq,original_max (8,1,4,8192)")
    ap.add_argument("--max-pos", type=int, default=131072, help="max_position_embeddings")
    ap.add_argument("--std", type=float, default=0.02, help="initializer_range")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--shard", default="5GB", help="max_shard_size for save_pretrained")
    a = ap.parse_args()

    m = {}
    if a.plan_json:
        with open(a.plan_json) as f:
            m = json.load(f)["model"]
    def pick(flag, key, default=None):
        v = getattr(a, flag)
        v = m.get(key, default) if v is None else v
        if v is None:
            sys.exit(f"make_model.py: give --{flag.replace('_', '-')} (or a --plan-json that has model.{key})")
        return v
    family = pick("family", "family")
    vocab, hidden, layers = pick("vocab", "vocab"), pick("hidden", "hidden"), pick("layers", "layers")
    heads, kv, hd, ffn = pick("heads", "heads"), pick("kv_heads", "kv_heads"), pick("head_dim", "head_dim"), pick("ffn", "ffn")
    tie = pick("tie", "tie_embeddings", False)
    eps = pick("norm_eps", "norm_eps", 1e-6 if family == "qwen3" else 1e-5)
    theta = pick("rope_theta", "rope_theta", 1e6 if family == "qwen3" else 10000.0)
    scaling = a.rope_scaling.split(",") if a.rope_scaling else None
    rs = m.get("rope_scaling")
    if scaling is None and rs:
        scaling = [rs["factor"], rs["low_freq"], rs["high_freq"], rs["original_max"]]

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    rope = {"rope_type": "default", "rope_theta": theta}
    if scaling:
        f, lo, hi, orig = float(scaling[0]), float(scaling[1]), float(scaling[2]), int(scaling[3])
        rope = {"rope_type": "llama3", "rope_theta": theta, "factor": f, "low_freq_factor": lo,
                "high_freq_factor": hi, "original_max_position_embeddings": orig}
    kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=eps,
              tie_word_embeddings=tie, max_position_embeddings=a.max_pos, initializer_range=a.std,
              attention_bias=False, hidden_act="silu")
    if int(transformers.__version__.split(".")[0]) >= 5:
        kw["rope_parameters"] = rope
    else:
        kw["rope_theta"] = theta
        kw["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"} if scaling else None
    if family == "qwen3":
        config, cls = Qwen3Config(use_sliding_window=False, **kw), Qwen3ForCausalLM
    else:
        config, cls = LlamaConfig(mlp_bias=False, **kw), LlamaForCausalLM

    torch.manual_seed(a.seed)
    model = cls(config).to(getattr(torch, a.dtype)).eval()
    save_kw = {"max_shard_size": a.shard}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kw["safe_serialization"] = True
    model.save_pretrained(a.out, **save_kw)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_model.py: {cls.__name__} with {n:,} parameters ({a.dtype}, seed {a.seed}) saved to {a.out}")


if __name__ == "__main__":
    main()
