-- expect: model.vocab = 500
-- expect: multiple of 8
-- expect: 504
return cpgen.extend(cpgen.load("tiny"), { model = { vocab = 500 } })
