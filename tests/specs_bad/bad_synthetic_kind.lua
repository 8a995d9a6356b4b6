-- expect: data.source = "synthetic:recal"
-- expect: did you mean "synthetic:recall"?
return cpgen.extend(cpgen.load("tiny"), { data = { source = "synthetic:recal" } })
