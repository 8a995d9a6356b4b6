-- expect: machine.gpu_mem = 141 bytes: too small
return cpgen.extend(cpgen.load("tiny"), { machine = { gpu_mem = 141 } })
