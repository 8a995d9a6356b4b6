-- expect: train.seq_len = 1000
-- expect: 2 x ring x gpus = 16
-- expect: use 992 or 1008
return cpgen.extend(cpgen.load("tiny"), { parallel = { gpus = 2, ring = 4 }, train = { seq_len = 1000 } })
