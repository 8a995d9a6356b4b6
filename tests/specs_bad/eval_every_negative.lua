-- set: train.eval_every=-1
-- expect: train.eval_every = -1
-- expect: must be at least 0
-- expect: (from --set train.eval_every=-1)
return cpgen.extend(cpgen.load("tiny"), { data = { val = "synthetic:copy" } })
