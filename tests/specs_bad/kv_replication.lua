-- expect: parallel.gpus = 6
-- expect: fewer KV heads (4) than GPUs
-- expect: multiple of kv_heads
return { model = { vocab = 512, hidden = 768, layers = 2, heads = 12, kv_heads = 4, ffn = 2048 },
         parallel = { gpus = 6 }, train = { seq_len = 6144 } }
