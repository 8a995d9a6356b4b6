-- expect: train.eval_every = 50
-- expect: data.val, which is not set
-- expect: or eval_every = 0
return cpgen.extend(cpgen.load("tiny"), { train = { eval_every = 50 } })
