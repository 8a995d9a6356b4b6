-- expect: bytecode_dofile.lua:4:
-- expect: bytecode.luac is a binary chunk (bytecode), refused: a spec loads Lua text only
-- dofile (and cpgen.load) read Lua text only; a file of bytecode is refused before it runs.
return dofile("../specs_bad_parts/bytecode.luac")
