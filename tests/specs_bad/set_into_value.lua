-- set: model.vocab.size=512
-- expect: --set model.vocab.size=512
-- expect: model.vocab is a value, not a section
return cpgen.load("tiny")
