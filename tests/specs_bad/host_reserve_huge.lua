-- expect: machine.host_reserve = 9223372036854775807
-- expect: too large (at most 1125899906842624)
return cpgen.extend(cpgen.load("tiny"), { machine = { host_reserve = math.maxinteger } })
