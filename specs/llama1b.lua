-- specs/llama1b.lua: the Llama-3.2-1B shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64,
-- ffn 8192, vocab 128256, tied embeddings), RoPE theta 500000 with Llama-3 scaling (factor 32, low 1, high 4,
-- original 8192) as in the Hugging Face config. The GPUs at hand (gpus = "auto") at 128K tokens.
return {
  model = { family = "llama", vocab = 128256, hidden = 2048, layers = 16, heads = 32, kv_heads = 8, head_dim = 64,
            ffn = 8192, norm_eps = 1e-5, tie_embeddings = true,
            rope = { theta = 500000, scaling = { factor = 32, low_freq = 1, high_freq = 4, original_max = 8192 } } },
  parallel = { gpus = "auto", upipe_heads = "auto", checkpoint = "layer", offload = "auto", optimizer = "auto",
               mlp_tile = "auto", loss_tile = "auto" },
  train = { seq_len = "128K", micro_batches = 1, steps = 10, lr = 3e-4, warmup = 2, weight_decay = 0.1, clip = 1.0 },
  data = { source = "synthetic:recall" },
  init = { from = "random", seed = 0 },
}
