-- expect: data.source = "file:shards/*.bin"
-- expect: "synthetic:"
-- expect: "tokens:"
return cpgen.extend(cpgen.load("tiny"), { data = { source = "file:shards/*.bin" } })
