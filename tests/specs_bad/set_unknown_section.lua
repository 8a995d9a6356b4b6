-- set: trian.steps=5
-- expect: --set trian.steps=5
-- expect: did you mean 'train'?
return cpgen.load("tiny")
