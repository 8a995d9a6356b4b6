-- tests/specs_bad_parts/included_error_base.lua: a base spec with a runtime error, included by
-- tests/specs_bad/included_error.lua.
local hidden = 256 + nil
return { model = { vocab = 512, hidden = hidden, layers = 2, heads = 4, ffn = 768 }, train = { seq_len = 2048 } }
