-- expect: parallel.offload = "disk"
-- expect: "auto", "none" or "all"
return cpgen.extend(cpgen.load("tiny"), { parallel = { offload = "disk" } })
