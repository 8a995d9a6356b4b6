-- expect: machine.host_runtime = 5368709120
-- expect: between 0 and machine.host_reserve (4294967296)
return cpgen.extend(cpgen.load("tiny"), { machine = { host_runtime = "5G" } })
