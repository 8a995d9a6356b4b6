-- tests/specs_ok/computed.lua: a spec is a program: it computes shapes and inherits from a shipped spec by name.
local width = 64 * 6
local layers = 0
for _ = 1, 3 do layers = layers + 1 end
return cpgen.extend(cpgen.load("tiny"), {
  model = { hidden = width, heads = width // 64, kv_heads = 2, ffn = math.floor(width * 8 / 3 / 8) * 8,
            layers = layers },
  train = { seq_len = string.format("%dK", 3) },
})
