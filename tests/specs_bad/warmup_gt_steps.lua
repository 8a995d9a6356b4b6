-- expect: train.warmup = 300
-- expect: must not exceed train.steps (200)
return cpgen.extend(cpgen.load("tiny"), { train = { warmup = 300 } })
