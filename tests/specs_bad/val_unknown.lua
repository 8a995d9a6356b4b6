-- expect: data.val = "held-out"
-- expect: "tokens:<glob>"
-- expect: "split:<fraction>"
-- expect: "synthetic:copy"
-- expect: "none"
return cpgen.extend(cpgen.load("tiny"), { data = { val = "held-out" } })
