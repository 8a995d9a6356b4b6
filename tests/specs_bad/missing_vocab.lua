-- expect: model.vocab is missing
-- expect: required
return { model = { hidden = 256, layers = 2, heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
