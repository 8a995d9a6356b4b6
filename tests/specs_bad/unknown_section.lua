-- expect: modle
-- expect: unknown section
-- expect: did you mean 'model'?
return { modle = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
