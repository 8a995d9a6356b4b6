-- expect: tests/specs_bad_parts/included_error_base.lua:3:
-- expect: loaded from tests/specs_bad/included_error.lua:4
-- An error inside an included file names that file and the spec that included it.
local base = dofile("../specs_bad_parts/included_error_base.lua")
return base
