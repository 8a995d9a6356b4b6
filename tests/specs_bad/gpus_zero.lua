-- expect: parallel.gpus = 0
-- expect: between 1 and 4096
return cpgen.extend(cpgen.load("tiny"), { parallel = { gpus = 0 } })
