-- expect: syntax_error.lua:6:
-- expect: '}' expected
-- A missing closing brace is a Lua syntax error, reported with file and line.
return { model = { vocab = 512, hidden = 256, layers = 2, heads = 4, ffn = 768 },
         train = { seq_len = 2048 }
