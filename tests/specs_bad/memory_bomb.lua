-- expect: more than 1024 MiB of memory
-- expect: without end
local mib = string.rep("x", 1 << 20)
local t = {}
while true do t[#t + 1] = mib .. #t end
