-- set: train.seq_len
-- expect: --set train.seq_len
-- expect: expected key.path=value
return cpgen.load("tiny")
