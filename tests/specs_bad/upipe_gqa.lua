-- expect: parallel.upipe_heads = 4
-- expect: GQA group is g = heads/kv_heads = 6
-- expect: valid values with gpus = 1: 1, 2, 3, 6 or 12
return { model = { vocab = 512, hidden = 768, layers = 2, heads = 12, kv_heads = 2, ffn = 2048 },
         parallel = { gpus = 1, upipe_heads = 4 }, train = { seq_len = 4096 } }
