-- expect: parallel.checkpoint_every = 2
-- expect: offload = "all" needs checkpoint_every = 1
return cpgen.extend(cpgen.load("tiny"), { parallel = { offload = "all", checkpoint_every = 2 } })
