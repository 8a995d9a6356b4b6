-- expect: train.lr: expected a number, got string "3e-4"
return cpgen.extend(cpgen.load("tiny"), { train = { lr = "3e-4" } })
