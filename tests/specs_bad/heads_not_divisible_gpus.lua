-- expect: parallel.gpus = 3
-- expect: heads (4) must be divisible by gpus
-- expect: use gpus = 1, 2 or 4
return cpgen.extend(cpgen.load("tiny"), { parallel = { gpus = 3 }, train = { seq_len = 3072 } })
