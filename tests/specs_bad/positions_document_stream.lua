-- expect: data.positions = "document": positions restart at each document only where attention stays inside
-- expect: set data.documents = "mask", or data.positions = "sequence"
return cpgen.extend(cpgen.load("tiny"), {
  data = { source = "tokens:data/*.bin", documents = "stream", positions = "document" },
})
