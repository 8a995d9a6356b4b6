-- expect: train.lr
-- expect: finite
return cpgen.extend(cpgen.load("tiny"), { train = { lr = 0 / 0 } })
