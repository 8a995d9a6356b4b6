-- tests/specs_ok/base.lua: a complete small spec that other test specs include with dofile.
return {
  model = { family = "llama", vocab = 1024, hidden = 512, layers = 4, heads = 8, kv_heads = 2, ffn = 1536 },
  parallel = { gpus = 2 },
  train = { seq_len = "8K", steps = 20, lr = 1e-3, warmup = 5 },
}
