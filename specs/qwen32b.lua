-- specs/qwen32b.lua: the Qwen3-32B shape (hidden 5120, 64 layers, 64 heads, 8 KV heads, head_dim 128 so q
-- projects 5120 -> 8192, ffn 25600, vocab 151936, untied), RMSNorm on q and k per head, RoPE theta 1e6 without
-- scaling, norm_eps 1e-6. Eight GPUs at 1M tokens, UPipe stages of 8 heads.
return {
  model = { family = "qwen3", vocab = 151936, hidden = 5120, layers = 64, heads = 64, kv_heads = 8, head_dim = 128,
            ffn = 25600, norm_eps = 1e-6, tie_embeddings = false, qk_norm = true,
            rope = { theta = 1000000 } },
  parallel = { gpus = 8, upipe_heads = 8, checkpoint = "layer", offload = "auto", optimizer = "auto",
               mlp_tile = "auto", loss_tile = "auto" },
  train = { seq_len = "1M", micro_batches = 1, steps = 10, lr = 1e-5, warmup = 2, weight_decay = 0.1, clip = 1.0 },
  data = { source = "synthetic:recall" },
  init = { from = "random", seed = 0 },
}
