-- expect: init.path is missing
-- expect: init.from = "hf"
return cpgen.extend(cpgen.load("tiny"), { init = { from = "hf" } })
