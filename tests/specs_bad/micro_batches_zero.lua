-- expect: train.micro_batches = 0
-- expect: at least 1
return cpgen.extend(cpgen.load("tiny"), { train = { micro_batches = 0 } })
