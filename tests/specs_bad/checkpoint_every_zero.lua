-- expect: parallel.checkpoint_every = 0
-- expect: must be at least 1
return cpgen.extend(cpgen.load("tiny"), { parallel = { checkpoint_every = 0 } })
