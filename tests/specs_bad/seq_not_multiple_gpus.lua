-- expect: train.seq_len = 2049
-- expect: multiple of gpus (2)
-- expect: use 2048 or 2050
return cpgen.extend(cpgen.load("tiny"), { parallel = { gpus = 2 }, train = { seq_len = 2049 } })
