-- expect: parallel.checkpoint = "layers"
-- expect: did you mean "layer"?
return cpgen.extend(cpgen.load("tiny"), { parallel = { checkpoint = "layers" } })
