-- expect: train.seq_len = 2
-- expect: at least 2 * gpus (4)
return cpgen.extend(cpgen.load("tiny"), { parallel = { gpus = 2 }, train = { seq_len = 2 } })
