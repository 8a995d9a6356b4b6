-- expect: model.hidden = 256
-- expect: divisible by heads (3)
-- expect: head_dim
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 3, ffn = 768 }, train = { seq_len = 2048 } }
