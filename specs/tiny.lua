-- specs/tiny.lua: a small Llama-family model that trains in seconds on one GPU. It is the spec of `make run` and
-- of the GPU tests, on the synthetic key/value recall task. In 200 steps the loss falls from ln(512) to the
-- task's value baseline, ln(128) (the model has learnt which tokens can be values); going below that baseline
-- needs recall across the context, which this size has not shown in a few thousand steps.
return {
  model = { family = "llama", vocab = 512, hidden = 256, layers = 2, heads = 4, kv_heads = 2, head_dim = 64,
            ffn = 768, norm_eps = 1e-5, tie_embeddings = false,
            rope = { theta = 10000 } },
  parallel = { gpus = 1, upipe_heads = "auto", checkpoint = "layer", offload = "auto", optimizer = "auto",
               mlp_tile = "auto", loss_tile = "auto" },
  train = { seq_len = "2K", micro_batches = 1, steps = 200, lr = 3e-3, warmup = 10, weight_decay = 0.1, clip = 1.0 },
  data = { source = "synthetic:recall" },
  init = { from = "random", seed = 0, std = 0.02 },
}
