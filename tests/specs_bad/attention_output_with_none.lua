-- expect: parallel.attention_output = "host"
-- expect: checkpoint = "none"
return cpgen.extend(cpgen.load("tiny"), { parallel = { checkpoint = "none", attention_output = "host" } })
