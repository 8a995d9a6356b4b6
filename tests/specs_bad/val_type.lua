-- expect: data.val: expected a string, got number 0.1
return cpgen.extend(cpgen.load("tiny"), { data = { val = 0.1 } })
