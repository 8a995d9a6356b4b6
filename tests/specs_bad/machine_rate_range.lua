-- expect: machine.hbm_gbps = 1e+308: must be a rate between 0.001 and 1e6 (GB/s per GPU
-- The cost model divides work by the rates: 1e308 GB/s is infinite once in bytes per second.
return cpgen.extend(cpgen.load("tiny"), { machine = { hbm_gbps = 1e308 } })
