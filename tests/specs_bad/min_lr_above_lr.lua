-- expect: train.min_lr = 0.01
-- expect: must not exceed train.lr
return cpgen.extend(cpgen.load("tiny"), { train = { min_lr = 1e-2 } })
