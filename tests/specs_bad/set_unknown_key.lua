-- set: train.seq_lne=1M
-- expect: --set train.seq_lne=1M
-- expect: unknown key 'seq_lne' in train; did you mean 'seq_len'?
return cpgen.load("tiny")
