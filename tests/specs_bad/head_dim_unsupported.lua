-- expect: model.head_dim = 96
-- expect: 64 or 128
return cpgen.extend(cpgen.load("tiny"), { model = { head_dim = 96 } })
