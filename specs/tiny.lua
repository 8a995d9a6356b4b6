-- specs/tiny.lua: a small Llama-family model that trains in seconds on one GPU. It is the spec of `make run` and
-- of the GPU tests, on the synthetic copy task: every scored token sits 1023 positions back, so the loss falls
-- below chance, ln(511) = 6.24, only once attention reaches across the sequence. On an H200 the 800 steps take
-- about 7 s and end near 3.2. Eight sequences per step: with one, this model stays at chance for a thousand steps.
return {
  model = { family = "llama", vocab = 512, hidden = 256, layers = 2, heads = 4, kv_heads = 2, head_dim = 64,
            ffn = 768, norm_eps = 1e-5, tie_embeddings = false,
            rope = { theta = 10000 } },
  parallel = { gpus = 1, upipe_heads = "auto", checkpoint = "layer", offload = "auto", optimizer = "auto",
               mlp_tile = "auto", loss_tile = "auto" },
  train = { seq_len = "2K", micro_batches = 8, steps = 800, lr = 3e-3, warmup = 50, weight_decay = 0.1, clip = 1.0,
            log_every = 50 },
  data = { source = "synthetic:copy" },
  init = { from = "random", seed = 0, std = 0.02 },
}
