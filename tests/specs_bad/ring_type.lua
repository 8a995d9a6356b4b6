-- expect: parallel.ring
-- expect: expected an integer
return cpgen.extend(cpgen.load("tiny"), { parallel = { ring = "auto" } })
