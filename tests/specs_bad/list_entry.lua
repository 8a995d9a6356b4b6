-- expect: model[1]
-- expect: name = value
return { model = { 512, hidden = 256, layers = 2, heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
