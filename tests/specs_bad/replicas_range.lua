-- expect: parallel.replicas = 0
-- expect: must be between 1 and 4096
return cpgen.extend(cpgen.load("tiny"), { parallel = { replicas = 0 } })
