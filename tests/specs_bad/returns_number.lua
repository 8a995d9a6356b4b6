-- expect: returned integer 42
-- expect: expected a table
return 42
