-- expect: train.seq_len is missing
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768 }, train = { steps = 10 } }
