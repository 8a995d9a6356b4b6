-- expect: no_io.lua:3:
-- expect: global 'io'
local f = io.open("/etc/passwd")
return cpgen.load("tiny")
