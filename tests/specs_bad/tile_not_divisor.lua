-- expect: parallel.mlp_tile = 1000
-- expect: T = seq_len/gpus = 2048
-- expect: such as 512 or 1K
return cpgen.extend(cpgen.load("tiny"), { parallel = { mlp_tile = 1000 } })
