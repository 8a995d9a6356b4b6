-- expect: data.documents = "mask": data.source = "synthetic:copy" has no document boundaries
-- expect: use data.source = "synthetic:packed"
return cpgen.extend(cpgen.load("tiny"), { data = { source = "synthetic:copy", documents = "mask" } })
