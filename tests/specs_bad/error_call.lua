-- expect: error_call.lua:3:
-- expect: this spec refuses to load
error("this spec refuses to load")
