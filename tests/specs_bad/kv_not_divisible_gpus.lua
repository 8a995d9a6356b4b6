-- expect: parallel.gpus = 4
-- (3 and 6 would hold whole KV heads but do not divide seq_len 4096, so they are not suggested)
-- expect: kv_heads (6) must be divisible by gpus
-- expect: use gpus = 1 or 2
return { model = { vocab = 512, hidden = 768, layers = 2, heads = 12, kv_heads = 6, ffn = 2048 },
         parallel = { gpus = 4 }, train = { seq_len = 4096 } }
