-- expect: model.kv_heads = 3
-- expect: heads (4) must be divisible by kv_heads
-- expect: 1, 2 or 4
return cpgen.extend(cpgen.load("tiny"), { model = { kv_heads = 3 } })
