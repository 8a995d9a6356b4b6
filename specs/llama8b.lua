-- specs/llama8b.lua: the Llama-3.1-8B shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, head_dim 128,
-- ffn 14336, vocab 128256, untied), RoPE theta 500000 with Llama-3 scaling (factor 8, low 1, high 4,
-- original 8192). The GPUs at hand (gpus = "auto"; written for 8) at 1M tokens, UPipe stages of 8 heads (one per
-- GPU on 8).
return {
  model = { family = "llama", vocab = 128256, hidden = 4096, layers = 32, heads = 32, kv_heads = 8, head_dim = 128,
            ffn = 14336, norm_eps = 1e-5, tie_embeddings = false,
            rope = { theta = 500000, scaling = { factor = 8, low_freq = 1, high_freq = 4, original_max = 8192 } } },
  parallel = { gpus = "auto", upipe_heads = 8,         -- U: heads per UPipe stage; = heads means plain Ulysses
               checkpoint = "layer", offload = "auto", optimizer = "auto", mlp_tile = "auto", loss_tile = "auto" },
  train = { seq_len = "1M", micro_batches = 1, steps = 10, lr = 1e-5, warmup = 2, weight_decay = 0.1, clip = 1.0 },
  data = { source = "synthetic:recall" },
  init = { from = "random", seed = 0 },
}
