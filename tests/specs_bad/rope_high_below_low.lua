-- expect: model.rope.scaling.high_freq = 1
-- expect: greater than low_freq (4)
return cpgen.extend(cpgen.load("tiny"),
                    { model = { rope = { scaling = { factor = 8, low_freq = 4, high_freq = 1 } } } })
