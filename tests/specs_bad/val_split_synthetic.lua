-- expect: data.val = "split:0.1"
-- expect: a split holds out the end of a tokens: source
-- expect: data.val = "synthetic:copy"
return cpgen.extend(cpgen.load("tiny"), { data = { val = "split:0.1" } })
