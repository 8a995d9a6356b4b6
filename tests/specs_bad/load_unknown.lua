-- expect: load_unknown.lua:3:
-- expect: no shipped spec named 'lama8b'; did you mean 'llama8b'?
return cpgen.load("lama8b")
