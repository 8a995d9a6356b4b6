-- expect: error_escapes.lua:3:  [31mred [0m
-- A spec's own message is printed as plain text: control bytes (here terminal escapes) become spaces.
error("\27[31mred\27[0m")
