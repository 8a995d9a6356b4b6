-- expect: extend_bad_arg.lua:3:
-- expect: cpgen.extend: argument 1 is nil, expected a table
return cpgen.extend(nil, { model = { layers = 2 } })
