-- expect: parallel.attention_output = "cpu"
-- expect: "auto", "gpu", "host" or "recompute"
return cpgen.extend(cpgen.load("tiny"), { parallel = { attention_output = "cpu" } })
