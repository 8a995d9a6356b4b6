-- expect: parallel: expected a table
-- expect: integer 8
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768 }, parallel = 8,
         train = { seq_len = 2048 } }
