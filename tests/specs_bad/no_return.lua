-- expect: does not return a table
-- The file computes a table but forgets to return it.
local spec = { model = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
