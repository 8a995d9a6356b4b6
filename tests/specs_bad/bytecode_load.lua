-- expect: bytecode_load.lua:6:
-- expect: load: a binary chunk (bytecode) is refused: a spec loads Lua text only
-- Bytecode written by hand (a Lua 5.4 header, then garbage), asked for in binary mode: load takes text only,
-- whatever mode it is given.
local chunk = "\27Lua\x54\0\x19\x93\r\n\x1a\n\4\8\8" .. string.rep("\xff", 64)
return assert(load(chunk, "=tampered", "b"))()
