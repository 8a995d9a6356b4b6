-- expect: parallel.mlp_tile = 512
-- expect: T = seq_len/(ring x gpus) = 256
return cpgen.extend(cpgen.load("tiny"), { parallel = { gpus = 1, ring = 4, mlp_tile = 512 }, train = { seq_len = 1024 } })
