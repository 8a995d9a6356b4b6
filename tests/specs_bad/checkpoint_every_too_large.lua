-- expect: parallel.checkpoint_every = 3
-- expect: more than model.layers (2)
return cpgen.extend(cpgen.load("tiny"), { parallel = { checkpoint_every = 3 } })
