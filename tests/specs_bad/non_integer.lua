-- expect: model.heads: expected an integer, got number 2.5
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 2.5, ffn = 768 }, train = { seq_len = 2048 } }
