-- expect: parallel.upipe_heads = 0
-- expect: "auto"
return cpgen.extend(cpgen.load("tiny"), { parallel = { upipe_heads = 0 } })
