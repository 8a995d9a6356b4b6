-- expect: model.seq_len
-- expect: train.seq_len
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768, seq_len = 2048 },
         train = { steps = 10 } }
