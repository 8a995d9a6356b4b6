-- expect: more than 1024 MiB of memory
-- expect: without end
local t = {}
while true do t[#t + 1] = string.rep("x", 1 << 20) .. #t end
