-- expect: dofile_missing.lua:3:
-- expect: cannot read 'no_such_base.lua'
return dofile("no_such_base.lua")
