-- expect: train.seq_len = 2147483648
-- expect: at most 1024M
return cpgen.extend(cpgen.load("tiny"), { train = { seq_len = "2048M" } })
