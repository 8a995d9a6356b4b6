-- expect: gc_finalizer.lua:5:
-- expect: may not use __gc finalizers
-- Lua runs finalizers with its hooks off: a finalizer that loops would outlast the time limit.
local spec = cpgen.load("tiny")
setmetatable(spec, { __gc = function() while true do end end })
return spec
