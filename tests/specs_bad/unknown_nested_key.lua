-- expect: model.rope.scaling.facter
-- expect: did you mean 'factor'?
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768,
                   rope = { theta = 10000, scaling = { facter = 8 } } },
         train = { seq_len = 2048 } }
