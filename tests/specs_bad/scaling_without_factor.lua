-- expect: model.rope.scaling.factor is missing
return cpgen.extend(cpgen.load("tiny"), { model = { rope = { scaling = { low_freq = 1 } } } })
