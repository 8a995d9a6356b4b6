-- expect: train.keep_checkpoints = -1
-- expect: 0 keeps all
return cpgen.extend(cpgen.load("tiny"), { train = { keep_checkpoints = -1 } })
