-- expect: model.layers = 0
-- expect: at least 1
return cpgen.extend(cpgen.load("tiny"), { model = { layers = 0 } })
