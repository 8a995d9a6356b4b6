-- expect: model section is missing
return { train = { seq_len = 2048 } }
