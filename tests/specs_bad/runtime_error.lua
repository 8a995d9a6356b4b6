-- expect: runtime_error.lua:4:
-- expect: attempt to index a nil value
local sizes = nil
local hidden = sizes.hidden
return { model = { vocab = 512, hidden = hidden, layers = 2, heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
