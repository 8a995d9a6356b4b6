-- tests/specs_ok/child.lua: includes base.lua by a path relative to this file (the test runs from the repo root),
-- overrides a few keys with cpgen.extend, and checks that extend left the base untouched.
local base = dofile("base.lua")
local spec = cpgen.extend(base, { model = { layers = 6 }, train = { seq_len = "16K" } }, { train = { steps = 30 } })
assert(base.model.layers == 4 and base.train.steps == 20, "cpgen.extend changed its input")
assert(spec.model.hidden == 512 and spec.model.kv_heads == 2, "cpgen.extend lost base keys")
return spec
