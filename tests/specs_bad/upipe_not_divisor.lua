-- expect: parallel.upipe_heads = 3
-- expect: must divide heads (4)
return cpgen.extend(cpgen.load("tiny"), { parallel = { upipe_heads = 3 } })
