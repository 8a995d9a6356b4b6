-- set: train.seq_len=lots
-- expect: train.seq_len: expected a length
-- expect: (from --set train.seq_len=lots)
return cpgen.load("tiny")
