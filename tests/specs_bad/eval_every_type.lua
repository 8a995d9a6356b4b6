-- expect: train.eval_every: expected an integer, got string "often"
return cpgen.extend(cpgen.load("tiny"), { data = { val = "synthetic:copy" }, train = { eval_every = "often" } })
