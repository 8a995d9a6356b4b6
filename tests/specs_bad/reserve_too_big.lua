-- expect: machine.reserve = 80.00 GiB
-- expect: less than machine.gpu_mem (80.00 GiB)
return cpgen.extend(cpgen.load("tiny"), { machine = { gpu_mem = "80G", reserve = "80GiB" } })
