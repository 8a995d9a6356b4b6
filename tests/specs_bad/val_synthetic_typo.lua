-- expect: data.val = "synthetic:recal"
-- expect: did you mean "synthetic:recall"?
return cpgen.extend(cpgen.load("tiny"), { data = { val = "synthetic:recal" } })
