-- expect: train.seq_len: expected a length
-- expect: "1Q"
return cpgen.extend(cpgen.load("tiny"), { train = { seq_len = "1Q" } })
