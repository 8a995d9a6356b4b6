-- expect: train.eps = 0
-- expect: positive
return cpgen.extend(cpgen.load("tiny"), { train = { eps = 0 } })
