-- expect: train.async_save: expected true or false
-- expect: "no"
return cpgen.extend(cpgen.load("tiny"), { train = { async_save = "no" } })
