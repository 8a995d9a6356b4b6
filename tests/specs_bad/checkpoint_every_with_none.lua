-- expect: parallel.checkpoint_every = 2
-- expect: checkpoint = "none"
return cpgen.extend(cpgen.load("tiny"), { parallel = { checkpoint = "none", checkpoint_every = 2 } })
