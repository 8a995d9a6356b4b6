-- expect: train.eval_sequences = 5
-- expect: multiple of parallel.replicas
-- expect: use 4 or 6
return cpgen.extend(cpgen.load("tiny"), { parallel = { replicas = 2 }, data = { val = "synthetic:copy" },
                                          train = { eval_sequences = 5 } })
