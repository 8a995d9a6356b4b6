-- expect: model.layers: expected an integer, got string "abc"
return { model = { vocab = 512, hidden = 256, layers = "abc", heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
