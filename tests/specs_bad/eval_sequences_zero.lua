-- expect: train.eval_sequences = 0
-- expect: must be at least 1
return cpgen.extend(cpgen.load("tiny"), { data = { val = "synthetic:copy" }, train = { eval_sequences = 0 } })
