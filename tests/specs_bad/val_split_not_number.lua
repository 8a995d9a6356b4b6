-- set: data.val=split:nan
-- expect: data.val = "split:nan"
-- expect: between 0 and 1
-- expect: (from --set data.val=split:nan)
return cpgen.extend(cpgen.load("tiny"), { data = { source = "tokens:shards/*.bin" } })
