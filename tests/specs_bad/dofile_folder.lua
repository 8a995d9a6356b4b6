-- expect: dofile_folder.lua:3: dofile: cannot read 'tests' (a folder, not a regular file)
-- A folder is named as one, not as an input/output error.
return dofile("tests")
