-- expect: model.tie_embeddings: expected true or false
-- expect: "yes"
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768, tie_embeddings = "yes" },
         train = { seq_len = 2048 } }
