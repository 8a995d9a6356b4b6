-- expect: model.ffn = 770
-- expect: multiple of 8
return cpgen.extend(cpgen.load("tiny"), { model = { ffn = 770 } })
