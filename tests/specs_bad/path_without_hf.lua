-- expect: init.path = "models/llama"
-- expect: only used with init.from = "hf"
return cpgen.extend(cpgen.load("tiny"), { init = { path = "models/llama" } })
