-- expect: error_table.lua:3:
-- expect: error object is a table value
error({ code = 1 })
