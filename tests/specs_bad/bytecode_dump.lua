-- expect: bytecode_dump.lua:5:
-- expect: string.dump: a spec may not make bytecode
-- A tampered string.dump result, given to load, corrupts the loader's memory (the known way out of a Lua
-- sandbox): specs load Lua text only, and string.dump is refused.
local code = string.dump(function() return 1 end)
return cpgen.load("tiny")
