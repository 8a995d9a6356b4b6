-- expect: train.beta2 = 1
-- expect: [0, 1)
return cpgen.extend(cpgen.load("tiny"), { train = { beta2 = 1.0 } })
