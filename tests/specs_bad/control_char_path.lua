-- expect: train.out_dir: contains a control character (byte 0x0a at offset 6); remove it
-- A newline in a path is a slip, and would garble every message and file that names it.
return cpgen.extend(cpgen.load("tiny"), { train = { out_dir = "runs/a\nb" } })
