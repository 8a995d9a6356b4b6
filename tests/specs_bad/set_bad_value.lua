-- set: model.kv_heads=3
-- expect: model.kv_heads = 3
-- expect: divisible
-- expect: (from --set model.kv_heads=3)
return cpgen.load("tiny")
