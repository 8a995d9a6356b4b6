-- expect: data.val = "split:1.5"
-- expect: between 0 and 1
-- expect: "split:0.01"
return cpgen.extend(cpgen.load("tiny"), { data = { source = "tokens:shards/*.bin", val = "split:1.5" } })
