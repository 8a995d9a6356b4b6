-- expect: memory_caught.lua: model.layers = 0: must be at least 1
-- An out-of-memory error that the spec caught is not why it failed: the message names the real cause.
pcall(function() return ("x"):rep(1.5e9) end)
return cpgen.extend(cpgen.load("tiny"), { model = { layers = 0 } })
