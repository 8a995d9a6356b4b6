-- expect: machine.host_reserve = -1
-- expect: must not be negative
return cpgen.extend(cpgen.load("tiny"), { machine = { host_reserve = -1 } })
