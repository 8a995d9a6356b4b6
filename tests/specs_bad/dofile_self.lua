-- expect: dofile_self.lua:
-- expect: overflow
-- A spec that includes itself recurses until Lua's C stack limit stops it.
return dofile("dofile_self.lua")
