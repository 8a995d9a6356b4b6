-- expect: train.warmup = 900
-- expect: must not exceed train.steps (800)
return cpgen.extend(cpgen.load("tiny"), { train = { warmup = 900 } })
