-- expect: parallel.loss_tile = 4096
-- expect: more than the tokens per GPU
return cpgen.extend(cpgen.load("tiny"), { parallel = { loss_tile = "4K" } })
