-- expect: train.lr = -0.001
-- expect: >= 0
return cpgen.extend(cpgen.load("tiny"), { train = { lr = -1e-3 } })
