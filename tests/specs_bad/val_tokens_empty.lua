-- expect: data.val = "tokens:"
-- expect: give the held-out shards after the prefix
return cpgen.extend(cpgen.load("tiny"), { data = { val = "tokens:" } })
