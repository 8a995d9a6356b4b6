-- tests/specs_ok/sub/grandchild.lua: includes a spec one folder up, which itself includes base.lua next to it;
-- each relative path resolves against the folder of the file that names it.
local spec = dofile("../child.lua")
spec.parallel.upipe_heads = 4
return spec
