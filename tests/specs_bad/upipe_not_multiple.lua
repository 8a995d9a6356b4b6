-- expect: parallel.upipe_heads = 3
-- expect: multiple of gpus (2)
-- expect: valid values with gpus = 2: 2 or 4
return cpgen.extend(cpgen.load("tiny"), { parallel = { gpus = 2, upipe_heads = 3 } })
