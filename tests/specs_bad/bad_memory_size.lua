-- expect: machine.gpu_mem: expected a size such as "141G"
-- expect: "lots"
return cpgen.extend(cpgen.load("tiny"), { machine = { gpu_mem = "lots" } })
