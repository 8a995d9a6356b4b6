-- expect: model.vocb
-- expect: unknown key
-- expect: did you mean 'vocab'?
return { model = { vocb = 512, hidden = 256, layers = 2, heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
